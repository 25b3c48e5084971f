"""A load, or ``fill_tables``, refuses tables with batches in flight, before anything
changes (dynemb/table/batches_in_flight.py).

A cached table's forward of 24 keys into a 16-row cache stages 8 of them; were a
load to run before the backward, the backward would write those staged rows, older
than the load, back over the loaded ones (and, cached or not, apply gradients
computed from the old rows). So the load refuses, naming the table and its batches;
after the backward (or once the forward's graph is dropped) it loads, and every key,
staged ones included, holds the loaded row.
"""

import gc

import numpy as np
import pytest
import torch

from dynemb.batched_dynamicemb_tables import BatchedDynamicEmbeddingTablesV2
from dynemb.checkpoint import DynamicEmbDump, DynamicEmbLoad
from dynemb.optimizer import EmbOptimType
from tests.support.caching_models import contents
from tests.support.caching_towers import batch, loss, module

KEYS = batch(np.arange(24))


def _saved(tmp_path, cache_rows):
    """A checkpoint of a module trained one step on KEYS (rows differ from a fresh one's)."""
    trained = module(EmbOptimType.EXACT_SGD, cache_rows)
    loss([trained(*KEYS)]).backward()
    DynamicEmbDump(tmp_path / "ckpt", trained)
    return tmp_path / "ckpt", contents(trained.tables[0])


def _rows(m):
    return {k: row for k, (row, _) in contents(m.tables[0]).items()}


def _same_rows(got, want):
    assert set(got) == set(want)
    for k in want:
        assert torch.equal(got[k], want[k]), f"row of key {k}"


@pytest.mark.parametrize("cache_rows", [16, 0], ids=["cached", "in_memory"])
def test_a_load_waits_for_no_backward(tmp_path, cache_rows):
    path, saved = _saved(tmp_path, cache_rows)
    m = module(EmbOptimType.EXACT_SGD, cache_rows)
    out = m(*KEYS)  # a training forward awaiting its backward
    if cache_rows:
        assert m.tables[0].staged_keys() == 8
    before = _rows(m)
    with pytest.raises(RuntimeError, match=r"DynamicEmbLoad: .*batches in flight.*'table_0' \(1\)"):
        DynamicEmbLoad(path, m)
    _same_rows(_rows(m), before)  # nothing changed
    loss([out]).backward()
    DynamicEmbLoad(path, m)
    _same_rows(_rows(m), {k: row for k, (row, _) in saved.items()})


def test_staged_keys_of_a_dropped_forward_take_the_loaded_rows(tmp_path):
    """A forward whose graph is dropped unused (here in a reference cycle, which only
    the cyclic collector frees) ends at the load: its staged keys take the loaded rows."""
    path, saved = _saved(tmp_path, 16)
    m = module(EmbOptimType.EXACT_SGD, 16)
    cycle = [m(*KEYS)]
    cycle.append(cycle)
    assert m.tables[0].staged_keys() == 8
    del cycle
    DynamicEmbLoad(path, m)
    assert m.tables[0].staged_keys() == 0
    _same_rows(_rows(m), {k: row for k, (row, _) in saved.items()})
    loss([m(*KEYS)]).backward()  # and it trains on


def test_fill_tables_waits_for_no_backward():
    cached = module(EmbOptimType.EXACT_SGD, 16)
    m = BatchedDynamicEmbeddingTablesV2(
        cached.table_options, feature_table_map=[0, 0], optimizer=EmbOptimType.EXACT_SGD,
        learning_rate=0.1,
    )  # fmt: skip
    out = m(*KEYS)
    before = _rows(m)
    with pytest.raises(RuntimeError, match=r"fill_tables: .*batches in flight.*'table_0'"):
        m.fill_tables(0.5)
    _same_rows(_rows(m), before)
    loss([out]).backward()
    del out
    gc.collect()
    m.fill_tables(0.5)
    assert len(_rows(m)) >= 0.5 * m.tables[0].max_capacity() - 1
