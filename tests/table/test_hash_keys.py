"""torch.ops.dynemb.hash_keys against the pure-Python reference hash."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dynemb import _ops
from tests.support.reference import bucket_of, digest_of

EDGE_KEYS = [0, 1, -1, 2**63 - 1, -(2**63), 2**31, -(2**31), 255, 256]


def _check(keys, num_buckets, device):
    t = torch.tensor(keys, dtype=torch.int64, device=device)
    bucket, digest = _ops.hash_keys(t, num_buckets)
    assert bucket.dtype == torch.int64 and digest.dtype == torch.uint8
    assert bucket.tolist() == [bucket_of(k, num_buckets) for k in keys]
    assert digest.tolist() == [digest_of(k) for k in keys]


@pytest.mark.parametrize("num_buckets", [1, 7, 1024, 2**32])
def test_edge_keys(device, num_buckets):
    _check(EDGE_KEYS, num_buckets, device)


@settings(max_examples=30, deadline=None)
@given(
    keys=st.lists(st.integers(-(2**63), 2**63 - 1), min_size=0, max_size=200),
    num_buckets=st.integers(1, 2**32),
)
def test_random_keys(keys, num_buckets):
    _check(keys, num_buckets, "cpu")


def test_large_batch_runs_in_parallel_and_matches():
    g = torch.Generator().manual_seed(0)
    keys = torch.randint(-(2**63), 2**63 - 1, (100_000,), generator=g)
    bucket, digest = _ops.hash_keys(keys, 12345)
    sample = torch.randint(0, keys.numel(), (500,), generator=g)
    for i in sample.tolist():
        assert bucket[i].item() == bucket_of(keys[i].item(), 12345)
        assert digest[i].item() == digest_of(keys[i].item())
    assert digest.min().item() >= 1
    assert bucket.min().item() >= 0 and bucket.max().item() < 12345


def test_buckets_are_uniform():
    keys = torch.arange(200_000, dtype=torch.int64)  # patterned ids must still spread
    bucket, _ = _ops.hash_keys(keys, 100)
    counts = torch.bincount(bucket, minlength=100).float()
    assert counts.min() > 0.9 * 2000 and counts.max() < 1.1 * 2000


@pytest.mark.parametrize(
    "keys, match",
    [
        (torch.zeros(4, dtype=torch.int32), "must have dtype Long"),
        (torch.zeros(4, dtype=torch.float64), "must have dtype Long"),
        (torch.zeros((2, 2), dtype=torch.int64), "must be 1-D"),
        (torch.zeros(8, dtype=torch.int64)[::2], "must be contiguous"),
    ],
)
def test_bad_keys_raise_naming_the_argument(keys, match):
    with pytest.raises((TypeError, ValueError), match=match) as info:
        _ops.hash_keys(keys, 16)
    assert "`keys`" in str(info.value)


@pytest.mark.parametrize("num_buckets", [0, -1, 2**32 + 1])
def test_bad_num_buckets_raise(num_buckets):
    with pytest.raises(ValueError, match="num_buckets"):
        _ops.hash_keys(torch.zeros(4, dtype=torch.int64), num_buckets)
