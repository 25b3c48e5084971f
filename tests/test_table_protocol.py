"""The Table protocol (dynemb/table/protocol.py): both table classes implement it, and a
cached table's training lookup reports its cache hits."""

import pytest
import torch

import dynemb
from dynemb.table.protocol import Table
from dynemb.tiering.factory import make_table

DIM = 4


def _cached(rows=64, capacity=1024):
    options = dynemb.DynamicEmbTableOptions(
        dim=DIM,
        max_capacity=capacity,
        caching=True,
        local_hbm_for_values=rows * DIM * 4,
        embedding_dtype=torch.float32,
    )
    return make_table("t", options, state_columns=0, device=torch.device("cpu"))


def test_both_table_classes_implement_the_protocol():
    plain = dynemb.ScoredHashTable(dim=DIM, capacity=256)
    cached = _cached()
    for table in (plain, cached):
        assert isinstance(table, Table), type(table).__name__
        keys = torch.tensor([5, 6, 7])
        slots, stats = table.find_or_insert_slots(keys)
        assert bool((slots >= 0).all()) and stats.failed == 0
        assert torch.equal(table.find_slots(keys), slots)
        with table.lock.read():
            assert table.buffers.tensors()[1].view(-1)[slots].tolist() == [5, 6, 7]
        assert len(table.init_values) == 6


def test_cached_table_counts_hits_of_a_training_lookup():
    table = _cached()
    first = torch.arange(10, dtype=torch.int64)
    _, stats = table.find_or_insert_slots(first)
    assert (stats.hits, stats.inserted, stats.failed) == (0, 10, 0)
    again = torch.arange(5, 15, dtype=torch.int64)  # 5 cached, 5 new
    _, stats = table.find_or_insert_slots(again)
    assert (stats.hits, stats.inserted, stats.failed) == (5, 5, 0)
    assert table.stats.lookup_hits == 5 and table.stats.lookup_keys == 20


def test_plain_table_lookup_counts_hits_the_same_way():
    table = dynemb.ScoredHashTable(dim=DIM, capacity=256)
    table.find_or_insert_slots(torch.arange(10, dtype=torch.int64))
    _, stats = table.find_or_insert_slots(torch.arange(5, 15, dtype=torch.int64))
    assert (stats.hits, stats.inserted, stats.failed) == (5, 5, 0)


def test_rollback_restores_rows_scores_and_size_in_place():
    table = dynemb.ScoredHashTable(
        dim=DIM, capacity=1024, score_strategy=dynemb.DynamicEmbScoreStrategy.LFU
    )
    keys = torch.arange(10, dtype=torch.int64)
    table.insert_or_assign(keys, torch.ones(10, DIM))
    snap = table.snapshot()
    buffers = table.buffers
    table.insert_or_assign(keys[:5], torch.zeros(5, DIM))  # overwrite, and score again
    table.find_or_insert(torch.arange(100, 110))
    table.erase(keys[5:])
    table.rollback(snap)
    assert table.buffers is buffers and table.size() == 10
    rows, found = table.find(keys)
    assert bool(found.all()) and torch.equal(rows, torch.ones(10, DIM))
    assert not bool(table.contains(torch.arange(100, 110)).any())
    assert table.get_scores(keys).tolist() == [1] * 10


def test_rollback_after_growth_is_refused():
    table = dynemb.ScoredHashTable(dim=DIM, capacity=4096, init_capacity=128, bucket_capacity=16)
    snap = table.snapshot()
    table.find_or_insert(torch.arange(2000, dtype=torch.int64))
    with pytest.raises(ValueError, match="grew since the snapshot"):
        table.rollback(snap)
