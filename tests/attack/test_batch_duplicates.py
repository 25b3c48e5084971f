"""A key repeated in one batch: one rule in every op and executor. The batch acts as if
its occurrences came in order (``insert_or_assign`` keeps the last value, CUSTOMIZED the
last score; ``find_or_insert`` inserts at the first, the rest are hits); ``restore``
refuses repeated keys, naming one and its positions, before storing anything."""

import pytest
import torch

import dynemb
from dynemb import DynamicEmbScoreStrategy as S

KEYS = torch.tensor([5, 9, 5, 7, 5])
VALUES = torch.arange(10, dtype=torch.float32).view(5, 2)  # row i = [2i, 2i + 1]
SCORES = torch.tensor([30, 1, 10, 2, 20])
STRATEGIES = [S.TIMESTAMP, S.STEP, S.LFU, S.CUSTOMIZED, S.NO_EVICTION]


def _table(strategy):
    return dynemb.ScoredHashTable(dim=2, capacity=128, score_strategy=strategy)


def _scores(strategy):
    return {"scores": SCORES} if strategy == S.CUSTOMIZED else {}


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("op", ["insert_or_assign", "insert_and_evict"])
def test_an_assign_keeps_the_last_occurrence(strategy, op):
    table = _table(strategy)
    getattr(table, op)(KEYS, VALUES, **_scores(strategy))
    assert table.size() == 3
    rows, found = table.find(torch.tensor([5, 9, 7]))
    assert found.all()
    assert torch.equal(rows, VALUES[[4, 1, 3]])  # key 5's last occurrence is position 4
    if strategy == S.CUSTOMIZED:
        assert table.get_scores(torch.tensor([5])).tolist() == [20]
    if strategy == S.LFU:
        assert table.get_scores(torch.tensor([5, 9])).tolist() == [3, 1]


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_a_lookup_inserts_once_and_every_occurrence_sees_that_row(strategy):
    table = _table(strategy)
    rows = table.find_or_insert(KEYS, **_scores(strategy))
    assert torch.equal(rows[0], rows[2]) and torch.equal(rows[0], rows[4])
    stats = table.last_stats
    assert (stats.inserted, stats.hits) == (3, 2)
    if strategy == S.CUSTOMIZED:
        assert table.get_scores(torch.tensor([5])).tolist() == [20]


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_restore_refuses_a_repeated_key_before_storing_anything(strategy):
    table = _table(strategy)
    one = {"scores": torch.tensor([1])} if strategy == S.CUSTOMIZED else {}
    table.insert_or_assign(torch.tensor([1]), torch.ones(1, 2), **one)
    saved = {"scores": SCORES} if table.keeps_scores else {}
    repeated = r"restore: `keys` must be distinct, got key 5 at positions \[0, 2, 4\]"
    with pytest.raises(ValueError, match=repeated):
        table.restore(KEYS, VALUES, **saved)
    assert table.size() == 1
    assert not table.contains(torch.tensor([5, 7, 9])).any()


def test_restore_of_distinct_keys_is_unchanged():
    table = _table(S.LFU)
    stats = table.restore(torch.tensor([5, 9]), VALUES[:2], scores=torch.tensor([4, 6]))
    assert stats.inserted == 2
    assert table.get_scores(torch.tensor([5, 9])).tolist() == [4, 6]
