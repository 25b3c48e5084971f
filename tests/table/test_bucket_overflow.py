"""A key stream built to overflow one bucket: the reported failures equal the true count."""

import pytest
import torch

import dynemb
from dynemb import DynamicEmbScoreStrategy as S
from dynemb import _ops
from tests.support.bucket_keys import keys_of_buckets


@pytest.mark.parametrize("grow", [False, True])
def test_no_eviction_reports_exactly_the_keys_that_did_not_fit(grow):
    bc, nb = 16, 8  # max table: 8 buckets; every key homed at 0, its second bucket 1
    t = dynemb.ScoredHashTable(
        dim=2,
        capacity=bc * nb,
        init_capacity=bc if grow else bc * nb,
        bucket_capacity=bc,
        score_strategy=S.NO_EVICTION,
    )
    keys = keys_of_buckets(100, nb, home=0, second=1)
    stored = []
    for chunk in keys.split(30):
        t.find_or_insert(chunk)
        stored += [k for k in chunk.tolist() if k not in t.last_stats.failed_keys.tolist()]
    window_slots = _ops.MAX_PROBE_BUCKETS * bc
    assert t.capacity() == t.max_capacity()
    assert t.size() == window_slots == len(stored)
    assert bool(t.contains(torch.tensor(stored)).all())
    failed = keys[~t.contains(keys)]
    assert failed.numel() == 100 - window_slots
    # Failing again reports them again: nothing is silently dropped.
    t.find_or_insert(failed)
    assert t.last_stats.failed == failed.numel()
    assert sorted(t.last_stats.failed_keys.tolist()) == sorted(failed.tolist())


def test_customized_refusals_are_counted_exactly():
    bc, nb = 16, 4
    t = dynemb.ScoredHashTable(
        dim=2, capacity=bc * nb, bucket_capacity=bc, score_strategy=S.CUSTOMIZED
    )
    keys = keys_of_buckets(50, nb, home=0, seed=1)
    scores = torch.arange(
        100, 50, -1
    )  # decreasing: after the bucket fills, every newcomer is lower
    t.find_or_insert(keys, scores)
    assert t.last_stats.inserted == bc
    assert t.last_stats.evicted == 0
    assert t.last_stats.failed == 50 - bc
    assert t.last_stats.failed_keys.tolist() == keys[bc:].tolist()
