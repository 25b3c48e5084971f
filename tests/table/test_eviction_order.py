"""Exact eviction order inside one full bucket, for every strategy that evicts.

A table of a single bucket (capacity == bucket_capacity == 16) makes every key
compete for the same slots. Evicted + remaining must always equal every key ever
stored, and no sentinel (or unknown key) is ever returned.
"""

import itertools

import pytest
import torch

import dynemb
from dynemb import DynamicEmbScoreStrategy as S
from tests.support.reference import digest_of

BC = 16


def _tie(key):
    """Equal scores: the smaller digest goes first, then the smaller key."""
    return (digest_of(key), key)


def _table(strategy):
    t = dynemb.ScoredHashTable(dim=2, capacity=BC, bucket_capacity=BC, score_strategy=strategy)
    clock = itertools.count(100, 10)
    t.state.clock = lambda: next(clock)
    return t


def _one(t, key, score=None, rows=None):
    keys = torch.tensor([key])
    values = torch.full((1, 2), float(key)) if rows is None else rows
    scores = None if score is None else torch.tensor([score])
    return t.insert_and_evict(keys, values, scores)


def _fill(t, keys, scores=None):
    for i, k in enumerate(keys):
        ek, _, _ = _one(t, k, None if scores is None else scores[i])
        assert ek.numel() == 0
    assert t.size() == BC


@pytest.mark.parametrize("strategy", [S.TIMESTAMP, S.STEP])
def test_recency_evicts_least_recently_used(strategy):
    t = _table(strategy)
    keys = list(range(1000, 1000 + BC))
    _fill(t, keys)  # key 1000 is the oldest
    t.find_or_insert(torch.tensor([1000, 1001]))  # now the oldest is 1002
    evicted = []
    for k in range(5000, 5004):
        ek, ev, _ = _one(t, k)
        evicted += ek.tolist()
        assert ev.tolist() == [[float(x), float(x)] for x in ek.tolist()]  # the victims' own rows
    assert evicted == [1002, 1003, 1004, 1005]


def test_lfu_evicts_least_frequent_then_by_digest_and_key():
    t = _table(S.LFU)
    keys = list(range(-8, 8))
    _fill(t, keys)
    # Access counts: key k gets (k + 8) % 4 extra accesses.
    for k in keys:
        for _ in range((k + 8) % 4):
            t.find_or_insert(torch.tensor([k]))
    got, got_scores = [], []
    for k in range(100, 106):
        ek, _, es = _one(t, k)
        got += ek.tolist()
        got_scores += es.tolist()
    # Each newcomer evicts a count-1 key (the least frequent): the residents of count 1
    # and the earlier newcomers (count 1 too) compete, ties by digest then key.
    count_one, want = {-8, -4, 0, 4}, []
    for k in range(100, 106):
        want.append(min(count_one, key=_tie))
        count_one = (count_one - {want[-1]}) | {k}
    assert got == want
    assert got_scores == [1] * 6
    assert t.get_scores(torch.tensor([-7, -6, -5, 105])).tolist() == [2, 3, 4, 1]
    assert len({digest_of(k) for k in [-8, -4, 0, 4]}) > 1  # the digest did break ties


def test_customized_evicts_lowest_score_and_refuses_lower_newcomers():
    t = _table(S.CUSTOMIZED)
    keys = list(range(BC))
    scores = [10 + (k * 7) % BC for k in keys]  # a permutation of 10..25
    _fill(t, keys, scores)
    ek, _, es = _one(t, 999, score=5)  # below every resident: refused
    assert (
        ek.numel() == 0 and t.last_stats.failed == 1 and t.last_stats.failed_keys.tolist() == [999]
    )
    assert not t.contains(torch.tensor([999])).item()
    ek, _, es = _one(t, 998, score=10)  # ties the minimum: admitted, evicts it
    assert es.tolist() == [10] and ek.tolist() == [keys[scores.index(10)]]
    # Ties between residents are broken by the smaller digest, then key.
    t2 = _table(S.CUSTOMIZED)
    _fill(t2, list(range(50, 50 + BC)), [7] * BC)
    ek, _, _ = _one(t2, 1, score=7)
    assert ek.tolist() == [min(range(50, 50 + BC), key=_tie)]


def test_compound_timestamp_lfu_evicts_by_count_and_keeps_time():
    t = _table((S.TIMESTAMP, S.LFU))
    keys = list(range(BC))
    _fill(t, keys)
    t.find_or_insert(torch.tensor(keys[1:]))  # all but key 0 now have count 2
    stamps = t.get_timestamps(torch.tensor(keys))
    assert stamps[0] < stamps[1] and len(set(stamps[1:].tolist())) == 1
    ek, _, es = _one(t, 77)
    assert ek.tolist() == [0] and es.tolist() == [1]


@pytest.mark.parametrize("strategy", [S.TIMESTAMP, S.STEP, S.LFU, S.CUSTOMIZED])
def test_evicted_plus_remaining_is_everything_inserted(strategy):
    t = _table(strategy)
    g = torch.Generator().manual_seed(1)
    inserted, evicted = set(), []
    for _ in range(20):
        keys = torch.randint(
            -(2**63), 2**63 - 1, (int(torch.randint(1, 40, (1,), generator=g)),), generator=g
        )
        scores = torch.randint(0, 50, keys.shape, generator=g) if strategy == S.CUSTOMIZED else None
        ek, _, _ = t.insert_and_evict(keys, torch.zeros(keys.numel(), 2), scores)
        stats = t.last_stats
        inserted |= set(keys.tolist()) - set(stats.failed_keys.tolist())
        assert set(ek.tolist()) <= inserted, "an evicted key was never inserted (sentinel?)"
        evicted += ek.tolist()
    offset, remaining = 0, []
    while offset < t.capacity():
        k, _, _, offset = t.export_batch(offset, 7)
        remaining += k.tolist()
    assert (
        len(evicted) == len(set(evicted)) or strategy == S.CUSTOMIZED
    )  # re-inserted keys may go twice
    assert set(remaining) | set(evicted) == inserted
    assert len(remaining) == t.size() == BC


def test_ties_in_score_and_digest_go_to_the_smaller_key():
    """The rare case the victim scan reads keys for: residents sharing the minimum
    score and the smallest digest."""
    by_digest = {}
    for k in range(-5000, 5000):
        by_digest.setdefault(digest_of(k), []).append(k)
    low = min(d for d, ks in by_digest.items() if len(ks) >= 3)
    twins = sorted(by_digest[low])[-3:]  # three keys of one digest, inserted largest first
    others = [k for d in sorted(by_digest) if d > low for k in by_digest[d][:1]][: BC - 3]
    t = _table(S.CUSTOMIZED)
    _fill(t, others + twins[::-1], [7] * BC)
    for want in twins:
        newcomer = max(by_digest[255]) + 10_000 + want  # scored 8: never the victim
        ek, _, es = _one(t, newcomer, score=8)
        assert ek.tolist() == [want] and es.tolist() == [7]
