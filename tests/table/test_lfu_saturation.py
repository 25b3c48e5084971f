"""LFU counts saturate at INT64_MAX (core/score_policy.h kMaxScore) instead of wrapping
to a negative int64: the hottest key stays the hottest and is never the victim. The
admission counter (KVCounter.add) saturates the same way."""

import pytest
import torch

import dynemb
from dynemb import DynamicEmbScoreStrategy as S
from dynemb import _ops
from dynemb.admission_strategies import KVCounter

MAX = 2**63 - 1
HOT = torch.tensor([7])


def test_max_score_is_int64_max():
    assert _ops.MAX_SCORE == MAX


@pytest.mark.parametrize("strategy", [S.LFU, (S.TIMESTAMP, S.LFU)])
def test_a_count_near_int64_max_saturates_and_stays_the_hottest(device, strategy):
    # One bucket of 16 slots: every new key beyond 16 evicts the least counted.
    t = dynemb.ScoredHashTable(
        dim=2, capacity=16, bucket_capacity=16, score_strategy=strategy, device=device
    )
    hot = HOT.to(device)
    t.restore(hot, torch.ones(1, 2, device=device), scores=torch.tensor([MAX - 2], device=device))
    for _ in range(4):  # one access per lookup: MAX - 1, MAX, MAX, MAX
        t.find_or_insert(hot)
    assert t.get_scores(hot).tolist() == [MAX]
    # A de-duplicated batch standing for many accesses saturates too.
    t.find_or_insert_slots(hot, torch.tensor([MAX], device=device))
    assert t.get_scores(hot).tolist() == [MAX]
    for start in range(100, 400, 20):  # fill the bucket, then evict 15 keys at a time
        t.find_or_insert(torch.arange(start, start + 15, device=device))
        assert bool(t.contains(hot)), "the hottest key was evicted"
    assert t.get_scores(hot).tolist() == [MAX]
    keys, _, scores, _ = t.export_batch(0, t.capacity())
    assert int(scores.min()) >= 0
    assert int(scores[keys == 7]) == MAX


def test_kv_counter_add_saturates():
    counter = KVCounter(capacity=64, bucket_capacity=16)
    counter.load(HOT, torch.tensor([MAX - 3]))
    assert counter.add(HOT, torch.tensor([5])).tolist() == [MAX]
    assert counter.add(HOT).tolist() == [MAX]
    # A batch whose own frequencies sum past INT64_MAX.
    keys = torch.tensor([9, 9, 9, 8])
    counts = counter.add(keys, torch.tensor([MAX, MAX, 1, 2**62]))
    assert counts.tolist() == [MAX, MAX, MAX, 2**62]
    stored = dict(zip(*[c.tolist() for c in counter.dump()]))
    assert stored == {7: MAX, 9: MAX, 8: 2**62}
