"""The Table protocol (dynemb/table/protocol.py): both table classes implement all of it,
the members a table in memory has trivially do nothing, a cache's act on both tiers,
and a cached table's training lookup reports its cache hits."""

import inspect

import pytest
import torch

import dynemb
from dynemb.table.change_log import ChangeLog
from dynemb.table.lookup_undo import LookupRecord
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
        assert len(table.init_values) == len(dynemb._ops.Init._fields)


def _protocol_members() -> dict:
    """Every member the protocol declares: name -> its definition (None: an attribute)."""
    members = {name: None for name in Table.__annotations__}
    for name, value in vars(Table).items():
        if not name.startswith("_"):
            members[name] = value
    return members


@pytest.mark.parametrize("kind", ["plain", "cached"])
def test_every_table_class_implements_the_whole_protocol(kind):
    table = dynemb.ScoredHashTable(dim=DIM, capacity=256) if kind == "plain" else _cached()
    members = _protocol_members()
    assert {"begin_batch", "batch_rows", "staged_rows", "end_batch", "eval_rows",
            "persistent_table", "empty_cache", "prefetch"} <= set(members)  # fmt: skip
    for name, declared in members.items():
        assert hasattr(table, name), f"{type(table).__name__} lacks {name}"
        mine = inspect.getattr_static(type(table), name, None)
        if isinstance(declared, property):
            assert isinstance(mine, property), f"{type(table).__name__}.{name}: not a property"
        elif callable(declared):
            want = list(inspect.signature(declared).parameters)
            got = list(inspect.signature(getattr(table, name)).parameters)
            assert got == want[1:], f"{type(table).__name__}.{name}{got}: protocol says {want}"


def test_a_plain_tables_batch_pins_its_keys_and_reads_its_own_buffers():
    table = dynemb.ScoredHashTable(dim=DIM, capacity=256)
    keys = torch.tensor([3, 1, 4])
    batch = table.begin_batch()
    assert table.state.pins.in_flight() == 1
    slots, stats = table.find_or_insert_slots(keys, None, batch)
    assert stats.inserted == 3 and torch.equal(table.find_slots(keys), slots)
    storage, read = table.batch_rows(slots, batch)
    assert storage is None and read is slots  # the buffers themselves, at the slots
    assert table.staged_rows(batch) is None
    table.end_batch(batch)
    assert table.state.pins.in_flight() == 0
    table.skip_batch()  # nothing to count
    assert table.state.pins.in_flight() == 0


def test_a_plain_tables_batch_brackets_the_change_logs_writes():
    table = dynemb.ScoredHashTable(dim=DIM, capacity=256)
    assert table.groups_lookups
    table.change_log = ChangeLog()
    assert not table.groups_lookups  # its lookups report the residents they evict
    batch = table.begin_batch()
    assert table.change_log._writes_pending == 1  # a seal now waits for the backward
    table.end_batch(batch)
    assert table.change_log._writes_pending == 0


def test_a_plain_table_has_no_cache_to_act_on():
    table = dynemb.ScoredHashTable(dim=DIM, capacity=256)
    keys = torch.tensor([7, 8, 9])
    table.find_or_insert(keys[:2])
    assert not table.has_cache and table.cache_stats is None
    assert table.prefetch(keys) is None and table.upcoming_batch() is None
    assert table.size() == 2  # the prefetch stored nothing
    storage, slots = table.eval_rows(keys)
    assert storage is None and torch.equal(slots, table.find_slots(keys))
    assert slots[2] == -1 and table.size() == 2
    assert table.persistent_table() is table
    table.empty_cache()
    assert table.size() == 2
    record = table.record_lookup(keys)
    assert isinstance(record, LookupRecord) and record.found.tolist() == [True, True, False]


def test_a_caches_batch_reads_its_staged_rows_and_trains_them_apart():
    table = _cached(rows=32)  # one bucket of 32 slots
    first = table.begin_batch()
    residents = torch.arange(100, 132, dtype=torch.int64)
    slots, stats = table.find_or_insert_slots(residents, None, first)
    assert bool((slots >= 0).all()) and stats.failed == 0
    assert table.batch_rows(slots, first)[0] is None and table.staged_rows(first) is None
    second = table.begin_batch()  # every slot is pinned by `first`: its new keys are staged
    keys = torch.tensor([100, 7, 8], dtype=torch.int64)
    slots, stats = table.find_or_insert_slots(keys, None, second)
    assert slots.tolist()[1:] == [-1, -1] and slots[0] >= 0
    assert (stats.hits, stats.failed) == (1, 0)  # staged keys are served, not failed
    storage, read = table.batch_rows(slots, second)
    assert read.tolist() == [0, 1, 2]  # one private row per distinct key, cached or staged
    want, found = table.read_rows(keys)
    assert bool(found.all()) and torch.equal(storage.values[:3, :DIM], want)
    staged, staged_slots = table.staged_rows(second)
    assert staged_slots[0] == -1 and bool((staged_slots[1:] >= 0).all())
    assert table.staged_keys() == 2
    table.end_batch(second)
    assert table.staged_keys() == 0  # their rows went home to the slow tier
    table.end_batch(first)
    assert bool(table.persistent_table().contains(keys).all())


def test_a_cache_counts_skipped_batches_and_reads_both_tiers_in_eval():
    table = _cached(rows=32)  # one bucket of 32 slots
    assert table.has_cache and table.cache_stats is table.stats
    table.find_or_insert_slots(torch.arange(32, dtype=torch.int64))
    table.find_or_insert_slots(torch.arange(32, 40, dtype=torch.int64))  # evicts 8 to the slow tier
    assert table.cache_size() == 32 and table.stats.written_back == 8
    b = table.prefetch(torch.tensor([1, 2], dtype=torch.int64))
    assert table.upcoming_batch() == b
    table.skip_batch()  # the forward of batch b had no key of this table
    assert table.upcoming_batch() is None
    keys = torch.tensor([0, 39, 12345], dtype=torch.int64)
    storage, slots = table.eval_rows(keys)
    assert slots.tolist() == [0, 1, -1]
    want, _ = table.read_rows(keys[:2])
    assert torch.equal(storage.values[:2, :DIM], want)
    assert table.record_lookup(keys) is None and not table.groups_lookups
    slow = table.persistent_table()
    assert slow is table.backing_table() and slow.size() == 40  # the cache written back
    table.empty_cache()
    assert table.cache_size() == 0 and table.size() == 40


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
