"""A key stream built to overflow one bucket: the reported failures equal the true count."""

import pytest
import torch

import dynemb
from dynemb import DynamicEmbScoreStrategy as S
from dynemb import _ops
from tests.support import reference as ref


def _keys_homed_at_bucket_zero(n, num_buckets, seed=0, second=None):
    """Keys whose bucket is 0 in a table of num_buckets (hence in any smaller one too);
    with `second`, whose second bucket there is `second` as well."""
    g = torch.Generator().manual_seed(seed)
    found = []
    while sum(k.numel() for k in found) < n:
        cand = torch.randint(-(2**63), 2**63 - 1, (1 << 20,), generator=g)
        bucket, _ = _ops.hash_keys(cand, num_buckets)
        cand = cand[bucket == 0]
        if second is not None:
            cand = torch.tensor(
                [k for k in cand.tolist() if ref.second_bucket_of(k, num_buckets) == second],
                dtype=torch.int64,
            )
        found.append(cand)
    return torch.cat(found)[:n]


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
    keys = _keys_homed_at_bucket_zero(100, nb, second=1)
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
    keys = _keys_homed_at_bucket_zero(50, nb, seed=1)
    scores = torch.arange(
        100, 50, -1
    )  # decreasing: after the bucket fills, every newcomer is lower
    t.find_or_insert(keys, scores)
    assert t.last_stats.inserted == bc
    assert t.last_stats.evicted == 0
    assert t.last_stats.failed == 50 - bc
    assert t.last_stats.failed_keys.tolist() == keys[bc:].tolist()
