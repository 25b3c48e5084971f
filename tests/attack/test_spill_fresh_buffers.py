"""A spilled table's new buffers start zero-filled whatever their files held: a growth
that never committed (the process stopped before ``table.json`` named its generation)
leaves a generation directory behind, and the next growth into it maps fresh slots, not
the stale ones (whose rehash would fail and drop the batch's new keys)."""

import gc
import shutil

import torch

from dynemb import ScoredHashTable


def _table(path) -> ScoredHashTable:
    return ScoredHashTable(
        dim=4, capacity=4096, init_capacity=256, bucket_capacity=16, spill_directory=str(path)
    )


def _keys(table: ScoredHashTable) -> list[int]:
    return sorted(table.export_batch(0, table.capacity())[0].tolist())


def test_a_growth_into_a_stale_generation_starts_empty(tmp_path):
    first, stale = tmp_path / "first", tmp_path / "stale"
    table = _table(first)
    table.find_or_insert(torch.arange(100))
    table.flush()
    assert table.buffers.generation == 0
    del table
    gc.collect()
    shutil.copytree(first, stale)  # the table as flushed at generation 0
    table = _table(first)
    table.find_or_insert(torch.arange(1000, 1150))  # grows once: generation 1
    assert table.buffers.generation == 1
    table.flush()
    del table
    gc.collect()
    shutil.copytree(first / "g1", stale / "g1")  # beside the generation table.json names

    reopened = _table(stale)
    assert reopened.buffers.generation == 0 and reopened.size() == 100
    new = torch.arange(2000, 2400)
    reopened.find_or_insert(new)
    memory = ScoredHashTable(dim=4, capacity=4096, init_capacity=256, bucket_capacity=16)
    memory.find_or_insert(torch.arange(100))
    memory.find_or_insert(new)
    assert reopened.buffers.generation > 0
    assert _keys(reopened) == _keys(memory) == sorted(list(range(100)) + new.tolist())
