"""Warm start from checkpoints on one process, in both dump formats (dynemb's and NVIDIA
DynamicEmb's layout): the source holds every dumped row and its optimizer state, a
table warm-started from it stores them exactly, and bad names or files are refused.
(Dumps of another world size: test_warm_start_sharded.py.)"""

import pytest
import torch

from dynemb import (
    BatchedDynamicEmbeddingTables,
    CheckpointError,
    DynamicEmbDump,
    DynamicEmbPoolingMode,
    DynamicEmbTableOptions,
    WarmStart,
)
from dynemb.optimizer import EmbOptimType


def _module(source=None, optimizer=EmbOptimType.EXACT_ROWWISE_ADAGRAD):
    return BatchedDynamicEmbeddingTables(
        [DynamicEmbTableOptions(dim=4, max_capacity=256, bucket_capacity=16, warm_start=source)],
        feature_table_map=[0], pooling_mode=DynamicEmbPoolingMode.SUM, optimizer=optimizer,
        learning_rate=0.1, eps=1e-3, table_names=["rw"],
    )  # fmt: skip


def _trained(tmp_path, format: str):
    module = _module()
    keys = torch.tensor([5, -9, 2**62, 17, 3])
    module(keys, torch.arange(6)).sum().backward()  # rows and state trained once
    path = tmp_path / format
    DynamicEmbDump(path, module, optim=True, format=format)
    rows = module.tables[0].find_entries(keys)[0]
    return path, keys, rows


@pytest.mark.parametrize("format", ["dynemb", "dynamicemb"])
def test_a_dump_warm_starts_rows_and_optimizer_state(tmp_path, format):
    path, keys, rows = _trained(tmp_path, format)
    name = "rw" if format == "dynemb" else "model.rw"
    for table_name in (name, "rw"):
        source = WarmStart.from_dump(path, table_name)
        got = source.rows(keys)
        assert bool(got.found.all()) and source.state_columns == 1
        assert torch.equal(torch.cat([got.values, got.state], dim=1), rows)
    warm = _module(WarmStart.from_dump(path, "rw"))
    warm.tables[0].find_or_insert_slots(torch.cat([keys, torch.tensor([99])]))
    assert torch.equal(warm.tables[0].find_entries(keys)[0], rows)
    # Rows only: into SGD (no state), or with optim=False (state initialised).
    sgd = _module(WarmStart.from_dump(path, "rw"), optimizer=EmbOptimType.EXACT_SGD)
    assert torch.equal(sgd.tables[0].find_or_insert(keys), rows[:, :4])
    plain = _module(WarmStart.from_dump(path, "rw", optim=False))
    plain.tables[0].find_or_insert_slots(keys)
    full = plain.tables[0].find_entries(keys)[0]
    assert torch.equal(full[:, :4], rows[:, :4]) and torch.equal(full[:, 4:], torch.zeros(5, 1))


@pytest.mark.parametrize("format", ["dynemb", "dynamicemb"])
def test_unknown_names_and_damaged_files_are_refused(tmp_path, format):
    path, _, _ = _trained(tmp_path, format)
    with pytest.raises(ValueError, match=r"no saved table for table_name='nope'"):
        WarmStart.from_dump(path, "nope")
    victim = max((f for f in path.rglob("*") if f.is_file() and "values" in f.name),
                 key=lambda f: f.stat().st_size)  # fmt: skip
    with open(victim, "r+b") as f:
        f.truncate(victim.stat().st_size - 4)
    with pytest.raises(CheckpointError):
        WarmStart.from_dump(path, "rw")
