"""DynamicEmbCheckMode.ERROR stores nothing of a batch with keys that could not be
stored: the lookup's insertions are undone (dynemb.table.lookup_undo) and the scores
and step it changed are put back before it raises, saying so."""

import pytest
import torch

from dynemb import (
    BatchedDynamicEmbeddingTables,
    DynamicEmbCheckMode,
    DynamicEmbInitializerArgs,
    DynamicEmbInitializerMode,
    DynamicEmbScoreStrategy,
    DynamicEmbTableOptions,
)
from dynemb.optimizer import EmbOptimType
from dynemb.table import lookup_undo

DEBUG = DynamicEmbInitializerArgs(mode=DynamicEmbInitializerMode.DEBUG)


def make(strategy, capacity=16, init_capacity=None):
    opts = DynamicEmbTableOptions(
        dim=4, max_capacity=capacity, init_capacity=init_capacity, bucket_capacity=16,
        initializer_args=DEBUG, safe_check_mode=DynamicEmbCheckMode.ERROR,
        score_strategy=strategy,
    )  # fmt: skip
    return BatchedDynamicEmbeddingTables([opts], [0], optimizer=EmbOptimType.ADAM)


def contents(m):
    return contents_of(m.tables[0])


def contents_of(t):
    """Keys, whole rows (with optimizer state), scores, size and step, in key order."""
    k, v, s, _ = t.export_batch(0, t.capacity(), include_extra=True)
    order = torch.argsort(k)
    return k[order], v[order], s[order], t.size(), t.score_step


def assert_same(a, b):
    for x, y in zip(a[:3], b[:3]):
        assert torch.equal(x, y)
    assert a[3:] == b[3:]


def train(m, keys):
    m(keys, torch.tensor([0, keys.numel()])).sum().backward()


# Full from the start, or grown by the failing batch (the table stays grown).
@pytest.mark.parametrize("capacity, init_capacity, new", [(16, 16, 30), (64, 16, 100)])
def test_an_overflowing_batch_stores_nothing(capacity, init_capacity, new):
    """All or nothing: no key of a batch that does not fit is stored (none is reported
    stored with zero rows)."""
    m = make(DynamicEmbScoreStrategy.NO_EVICTION, capacity, init_capacity)
    train(m, torch.arange(10))
    before = contents(m)
    batch = torch.cat([torch.arange(5), torch.arange(100, 100 + new)])  # 5 stored, new keys
    with pytest.raises(RuntimeError) as error:
        m(batch, torch.tensor([0, batch.numel()]))
    assert_same(contents(m), before)
    assert "could not be stored" in str(error.value)
    assert "nothing of this batch is stored" in str(error.value)
    assert m.step == 1
    train(m, torch.arange(10))  # the table still trains
    assert m.step == 2


def test_customized_newcomers_refused_by_a_full_table_store_nothing():
    m = make(DynamicEmbScoreStrategy.CUSTOMIZED)
    t = m.tables[0]
    t.custom_score = 100
    train(m, torch.arange(16))  # a full table of keys scored 100
    before = contents(m)
    t.custom_score = 50  # newcomers rank below every resident: refused
    with pytest.raises(RuntimeError, match="nothing of this batch is stored"):
        m(torch.arange(100, 104), torch.tensor([0, 4]))
    assert_same(contents(m), before)


def test_the_failing_batch_evicts_none_of_its_own_keys():
    """CUSTOMIZED: the batch scores keys 0, 1 lower than every other resident, but
    they are the batch's own keys (pinned): no newcomer evicts them, the newcomers
    fail (a lower score is refused by the others), and the undo restores every row
    and score: nothing is lost."""
    m = make(DynamicEmbScoreStrategy.CUSTOMIZED)
    t = m.tables[0]
    t.custom_score = 100
    train(m, torch.arange(16))
    before = contents(m)
    t.custom_score = 50
    batch = torch.tensor([100, 101, 0, 1, 102])
    with pytest.raises(RuntimeError, match="nothing of this batch is stored") as raised:
        m(batch, torch.tensor([0, 5]))
    assert "lost" not in str(raised.value)
    keys, rows, scores, size, step = contents(m)
    assert size == 16 and step == before[4]
    assert torch.equal(keys, before[0]) and torch.equal(rows, before[1])
    assert set(scores.tolist()) == {100}  # the batch's keys got their scores back


def test_the_tables_looked_up_before_the_failing_one_are_undone_too():
    """Table 0 (IGNORE, room to spare) inserts the batch's keys and rescores its
    stored ones; then table 1 (ERROR) overflows: neither keeps anything."""
    roomy = DynamicEmbTableOptions(
        dim=4, max_capacity=1024, bucket_capacity=16, initializer_args=DEBUG,
        score_strategy=DynamicEmbScoreStrategy.LFU,
    )  # fmt: skip
    small = DynamicEmbTableOptions(
        dim=4, max_capacity=16, bucket_capacity=16, initializer_args=DEBUG,
        safe_check_mode=DynamicEmbCheckMode.ERROR,
        score_strategy=DynamicEmbScoreStrategy.NO_EVICTION,
    )  # fmt: skip
    m = BatchedDynamicEmbeddingTables([roomy, small], [0, 1], optimizer=EmbOptimType.ADAM)
    # 1 sample, feature 0 -> table 0, feature 1 -> table 1
    m(torch.arange(20), torch.tensor([0, 10, 20])).sum().backward()
    before = [contents_of(t) for t in m.tables]
    indices = torch.cat([torch.arange(5), torch.arange(50, 80), torch.arange(100, 130)])
    with pytest.raises(RuntimeError, match=r"lookups undone in tables \['table_0', 'table_1'\]"):
        m(indices, torch.tensor([0, 35, 65]))
    for t, b in zip(m.tables, before, strict=True):
        assert_same(contents_of(t), b)


def test_undo_refuses_to_guess_after_a_concurrent_change():
    m = make(DynamicEmbScoreStrategy.NO_EVICTION)
    t = m.tables[0]
    keys = torch.arange(20)
    before = lookup_undo.record(t, keys)
    t.erase(torch.tensor([3]))  # someone else's change
    slots, stats = t.find_or_insert_slots(keys)
    with pytest.raises(ValueError, match="the table changed concurrently"):
        lookup_undo.undo(t, before, slots, stats)
