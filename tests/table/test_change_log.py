"""A table's ChangeLog records every key an upsert stores and every key that leaves
(evicted, erased, cleared, rolled back); without a log nothing is recorded."""

import torch

from dynemb import DynamicEmbScoreStrategy
from dynemb.table import change_log
from dynemb.table.change_log import ChangeLog
from dynemb.table.scored_hash_table import ScoredHashTable


def _table() -> ScoredHashTable:
    return ScoredHashTable(
        dim=2, capacity=16, bucket_capacity=16, score_strategy=DynamicEmbScoreStrategy.STEP
    )


def test_removed_keys_are_exactly_the_keys_that_left():
    table = _table()
    table.change_log = ChangeLog()
    seen = torch.arange(40)
    for begin in range(0, 40, 8):  # 40 keys through 16 slots: evictions
        table.find_or_insert_slots(seen[begin : begin + 8])
    table.insert_or_assign(torch.tensor([100]), torch.ones(1, 2))
    table.erase(torch.tensor([100, 1000]))
    touched, removed = table.change_log.take()
    assert torch.equal(touched, torch.cat([seen, torch.tensor([100])]))
    gone = seen[~table.contains(seen)]
    assert torch.equal(removed, torch.cat([gone, torch.tensor([100])]))
    assert table.change_log.take()[0].numel() == 0  # taken: empty again


def test_clear_and_rollback_record_every_key():
    table = _table()
    table.find_or_insert_slots(torch.arange(5))
    snapshot = table.snapshot()
    table.change_log = ChangeLog()
    table.erase(torch.tensor([0]))
    table.rollback(snapshot)
    touched, removed = table.change_log.take()
    assert torch.equal(touched, torch.arange(5)) and torch.equal(removed, torch.arange(5))
    table.clear()
    assert torch.equal(table.change_log.take()[1], torch.arange(5))


def test_an_untracked_table_records_nothing():
    table = _table()
    assert table.change_log is None
    table.find_or_insert_slots(torch.arange(40))  # evicts; nothing to record into
    assert table.size() == 16


def _logged(parts: int = 5) -> ChangeLog:
    log = ChangeLog()
    for i in range(parts):  # overlapping parts, out of order
        log.touched(torch.arange(10 - 3 * i, 20 - 3 * i))
        log.removed(torch.tensor([i % 2, 7]))
    return log


def test_compact_keeps_the_same_keys_in_one_part_each():
    expected = _logged().take()
    log = _logged()
    assert log.parts == 10
    log.compact()
    assert log.parts == 2
    log.compact()  # nothing to merge
    assert log.parts == 2
    got = log.take()
    assert all(torch.equal(g, e) for g, e in zip(got, expected, strict=True))


def test_keys_recorded_during_a_compaction_stay(monkeypatch):
    log = _logged()
    distinct = change_log._compacted
    calls = []

    def recording_meanwhile(parts):
        if not calls:
            log.touched(torch.tensor([1000]))  # another thread records meanwhile
        calls.append(1)
        return distinct(parts)

    monkeypatch.setattr(change_log, "_compacted", recording_meanwhile)
    log.compact()
    monkeypatch.setattr(change_log, "_compacted", distinct)
    assert log.parts == 3  # the merged parts, and the one recorded meanwhile
    touched, removed = log.take()
    assert torch.equal(touched, torch.cat([torch.arange(-2, 20), torch.tensor([1000])]))
    assert torch.equal(removed, torch.tensor([0, 1, 7]))


def test_a_take_during_a_compaction_drops_the_compaction(monkeypatch):
    log = _logged()
    taken = []
    distinct = change_log._compacted

    def taking_meanwhile(parts):
        if not taken:
            taken.append(None)
            monkeypatch.setattr(change_log, "_compacted", distinct)
            taken[0] = log.take()  # the boundary's take, on the training thread
            log.touched(torch.tensor([1000]))  # recorded after it
        return distinct(parts)

    monkeypatch.setattr(change_log, "_compacted", taking_meanwhile)
    log.compact()
    assert torch.equal(taken[0][0], torch.arange(-2, 20))
    touched, removed = log.take()  # only what came after the take: nothing merged back
    assert torch.equal(touched, torch.tensor([1000])) and removed.numel() == 0


def _keys(*values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int64)


def test_a_seal_waits_for_the_pending_writes_then_closes_a_generation():
    log = ChangeLog()
    log.begin_writes()  # a training lookup records 1, 2; its backward writes them
    log.touched(_keys(1, 2))
    log.request_seal()
    log.removed(_keys(3))  # an erase while the rows are not written: no seal
    assert log.take_sealed() is None
    log.end_writes()
    log.touched(_keys(4))  # the next lookup: sealed first, then recorded
    touched, removed = log.take_sealed()
    assert torch.equal(touched, _keys(1, 2)) and torch.equal(removed, _keys(3))
    assert log.take_sealed() is None  # one generation per request
    log.touched(_keys(5))
    assert log.take_sealed() is None
    log.request_seal()
    log.touched(_keys(6))
    touched, removed = log.take_sealed()
    assert torch.equal(touched, _keys(4, 5)) and removed.numel() == 0
    touched, removed = log.take()
    assert torch.equal(touched, _keys(6)) and removed.numel() == 0


def test_a_seal_requested_during_a_lookup_falls_before_it_or_after_its_backward():
    """A training lookup records its keys, then the residents it evicted; its backward
    writes the keys' rows later. A seal requested at any moment (the writer thread's)
    never falls between the lookup's records: it would hold keys not written yet."""
    log = ChangeLog()
    log.begin_writes()
    log.touched(_keys(1))
    log.end_writes()
    log.request_seal()
    log.begin_writes()  # the next lookup is announced: {1} is sealed here, before it
    assert torch.equal(log.take_sealed()[0], _keys(1))
    log.touched(_keys(2, 3))
    log.request_seal()  # between the lookup's two records
    log.removed(_keys(4))  # the residents it evicted
    assert log.take_sealed() is None
    log.end_writes()  # the backward wrote 2 and 3
    log.touched(_keys(5))
    touched, removed = log.take_sealed()
    assert torch.equal(touched, _keys(2, 3)) and torch.equal(removed, _keys(4))


def test_a_log_never_bracketed_by_a_training_path_never_seals():
    log = ChangeLog()
    log.request_seal()
    log.touched(_keys(1))
    log.touched(_keys(2))
    assert log.take_sealed() is None
    assert torch.equal(log.take()[0], _keys(1, 2))


def test_take_returns_the_sealed_generations_not_read_and_forgets_pending_writes():
    log = ChangeLog()
    log.touched(_keys(1))
    log.begin_writes()
    log.end_writes()
    log.request_seal()
    log.removed(_keys(2))  # seals {1}
    log.begin_writes()  # a forward whose backward never runs
    touched, removed = log.take()  # a boundary
    assert torch.equal(touched, _keys(1)) and torch.equal(removed, _keys(2))
    log.touched(_keys(3))
    log.begin_writes()
    log.request_seal()
    log.end_writes()
    log.touched(_keys(4))  # not held back by the forward before the boundary
    assert torch.equal(log.take_sealed()[0], _keys(3))


def test_a_compaction_across_a_seal_is_dropped(monkeypatch):
    log = ChangeLog()
    log.touched(_keys(1))
    log.touched(_keys(2))
    log.begin_writes()
    log.end_writes()
    log.request_seal()
    distinct = change_log._compacted

    def seal_meanwhile(parts):
        log.touched(_keys(7))  # seals {1, 2}, then records 7
        return distinct(parts)

    monkeypatch.setattr(change_log, "_compacted", seal_meanwhile)
    log.compact()
    monkeypatch.setattr(change_log, "_compacted", distinct)
    assert torch.equal(log.take_sealed()[0], _keys(1, 2))
    assert torch.equal(log.take()[0], _keys(7))


def test_touched_bound_counts_every_recorded_key_until_compacted_then_distinct_ones():
    log = ChangeLog()
    assert log.touched_bound() == 0
    log.touched(torch.tensor([1, 2, 2]))
    log.touched(torch.tensor([2, 3]))
    log.removed(torch.tensor([7, 8]))  # not touched: no row to capture
    assert log.touched_bound() == 5
    log.compact()
    assert log.touched_bound() == 3 == len(log.take()[0])
    assert log.touched_bound() == 0
    log.begin_writes()
    log.touched(torch.tensor([4, 5]))
    log.end_writes()
    log.request_seal()
    log.touched(torch.tensor([5, 6]))  # seals the generation [4, 5] first
    assert log.touched_bound() == 4  # sealed or not: the next take returns them all
    sealed = log.take_sealed()
    assert sealed is not None and sealed[0].tolist() == [4, 5]
    assert log.touched_bound() == 2
