"""What leaves the table after batches larger than it holds only its own keys' rows.

Training with batches whose distinct keys overflow the table (the in-batch eviction
of test_batch_pins.py), each step checked against its own-row rule; then a
DynamicEmbDump/DynamicEmbLoad round trip, an incremental dump and a served base plus
deltas must give back exactly the shadow of stored rows those checks proved.
"""

import pytest
import torch

from dynemb import DynamicEmbDump, DynamicEmbLoad, DynamicEmbScoreStrategy
from dynemb.deltas import DeltaPublisher, delta_path
from dynemb.incremental_dump import incremental_dump
from dynemb.inference.exportable_tables import InferenceEmbeddingCollection
from tests.support.batch_pins import (
    check_own_rows,
    initial_rows,
    lookup_rows,
    pin_module,
    pin_options,
    stored_rows,
)

S = DynamicEmbScoreStrategy
STEPS = 5


def _zipf_batch(gen: torch.Generator) -> torch.Tensor:
    """1,024 Zipf(1.05) lookups over 4,000 ids: several times the table's 256 rows."""
    probs = 1.0 / torch.arange(1, 4001, dtype=torch.float64) ** 1.05
    ids = torch.multinomial(probs, 1024, replacement=True, generator=gen)
    return ids * 7919 % 100003


def _train_checked(module, on_step=None) -> dict[int, torch.Tensor]:
    """STEPS checked steps; returns the proven rows (key -> row) after the last."""
    gen = torch.Generator().manual_seed(5)
    for step in range(STEPS):
        keys = _zipf_batch(gen)
        before = stored_rows(module)
        init = initial_rows(keys)
        out = lookup_rows(module, keys)
        out.sum().backward()
        after = stored_rows(module)
        check_own_rows(module, keys, out, before, after, init)
        assert module.tables[0].last_stats.evicted + module.tables[0].last_stats.failed > 0
        if on_step is not None:
            on_step(step)
    return after


def _assert_rows(keys: torch.Tensor, rows: torch.Tensor, proven: dict[int, torch.Tensor]):
    assert sorted(keys.tolist()) == sorted(proven)
    for k, row in zip(keys.tolist(), rows, strict=True):
        assert torch.equal(row, proven[k]), f"key {k}: not its own row"


@pytest.mark.parametrize("strategy", [S.LFU, S.TIMESTAMP])
def test_dump_and_load_after_overflowing_batches_hold_own_rows(tmp_path, strategy):
    module = pin_module(strategy, 256, 128)
    proven = _train_checked(module)
    DynamicEmbDump(tmp_path / "ckpt", module, optim=True)
    loaded = pin_module(strategy, 256, 128)
    DynamicEmbLoad(tmp_path / "ckpt", loaded, optim=True)
    restored = stored_rows(loaded)
    _assert_rows(torch.tensor(list(restored)), torch.stack(list(restored.values())), proven)


@pytest.mark.parametrize("strategy", [S.LFU, S.STEP])
def test_incremental_dump_after_overflowing_batches_holds_own_rows(strategy):
    module = pin_module(strategy, 256, 128)
    proven = _train_checked(module)
    dumped, _ = incremental_dump(module, 0)
    ((keys, rows),) = dumped["model"].values()
    _assert_rows(keys, rows, proven)


def test_served_deltas_after_overflowing_batches_hold_own_rows(tmp_path):
    """A serving table built from a base and a delta per step reads each stored key's
    proven row, and the eval initializer's (zeros) for keys the table no longer has."""
    module = pin_module(S.LFU, 256, 128)
    publisher = DeltaPublisher(module, tmp_path)
    seen = []

    def publish(step):
        if step == 0:
            publisher.publish_base()
        else:
            publisher.publish()

    gen = torch.Generator().manual_seed(5)
    for _ in range(STEPS):
        seen.append(_zipf_batch(gen))
    proven = _train_checked(module, publish)
    serving = InferenceEmbeddingCollection(
        [pin_options(S.LFU, 256, 128)], table_names=module.table_names, feature_table_map=[0]
    )
    serving.load_from_dynamicemb_file(publisher.base_path)
    for version in range(1, publisher.version + 1):
        serving.apply_delta(delta_path(tmp_path, version))
    every = torch.unique(torch.cat(seen))
    got = lookup_rows(serving, every)
    for k, row in zip(every.tolist(), got, strict=True):
        expected = proven.get(k, torch.zeros(4))
        assert torch.equal(row, expected), f"key {k}: the served row is not its own"
    assert len(proven) == serving.sizes[0]
