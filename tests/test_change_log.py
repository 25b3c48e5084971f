"""A table's ChangeLog records every key an upsert stores and every key that leaves
(evicted, erased, cleared, rolled back); without a log nothing is recorded."""

import torch

from dynemb import DynamicEmbScoreStrategy
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
