"""``rollback`` takes back only a snapshot of its own table: another table's snapshot is
refused with a ValueError saying so, whether or not the layouts match (with matching
layouts, the table would become a copy of the other)."""

import pytest
import torch

import dynemb

KEYS = torch.tensor([1, 2, 3])


def _table(capacity=256):
    return dynemb.ScoredHashTable(dim=2, capacity=capacity)


def _contents(table):
    keys, values, _, _ = table.export_batch(0, table.capacity())
    order = torch.argsort(keys)
    return keys[order], values[order]


@pytest.mark.parametrize("capacity", [256, 512])  # the same layout, and another
def test_another_tables_snapshot_is_refused_and_nothing_changes(capacity):
    mine, other = _table(), _table(capacity)
    mine.insert_or_assign(KEYS, torch.ones(3, 2))
    other.insert_or_assign(torch.tensor([7]), torch.zeros(1, 2))
    before = _contents(mine)
    with pytest.raises(ValueError, match="rollback: `snapshot` was taken from another table"):
        mine.rollback(other.snapshot())
    after = _contents(mine)
    assert torch.equal(before[0], after[0]) and torch.equal(before[1], after[1])


def test_anything_but_a_snapshot_is_a_type_error():
    with pytest.raises(TypeError, match="`snapshot` must be a TableSnapshot.*got dict"):
        _table().rollback({})


def test_a_table_rolls_back_to_its_own_snapshot():
    table = _table()
    table.insert_or_assign(KEYS, torch.ones(3, 2))
    snap = table.snapshot()
    table.insert_or_assign(torch.tensor([9]), torch.zeros(1, 2))
    table.erase(torch.tensor([1]))
    table.rollback(snap)
    assert table.contains(torch.tensor([1, 2, 3, 9])).tolist() == [True, True, True, False]
    assert table.size() == 3
