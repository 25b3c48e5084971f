"""unique_keys against an oracle: distinct keys in first-occurrence order.

The CPU executor's set (core/dedup.h, DedupIdSetRef) and the emulated CUDA one
(DedupSetRef) differ; both must give torch's distinct keys and counts, numbered by
first occurrence, for any batch: empty, one key, all equal, all distinct, extreme
int64 values, long probe runs (more keys than a small set's cells go to few homes).
"""

import dynemb._C  # noqa: F401  (loads both op libraries)
import pytest
import torch

LIBS = {"cpu": torch.ops.dynemb, "emulated": torch.ops.dynemb_cuda_emulated}
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


def _oracle(keys):
    """(unique, inverse, counts) with uids in order of first occurrence, from torch.unique."""
    if keys.numel() == 0:
        empty = torch.empty(0, dtype=torch.int64)
        return empty, empty, empty
    values, inverse, counts = torch.unique(keys, return_inverse=True, return_counts=True)
    positions = torch.arange(keys.numel())
    first = torch.full((values.numel(),), keys.numel()).scatter_reduce(
        0, inverse, positions, reduce="amin"
    )
    order = torch.argsort(first)  # sorted id -> rank of first occurrence
    uid = torch.empty_like(order)
    uid[order] = torch.arange(order.numel())
    return values[order], uid[inverse], counts[order]


def _batches():
    g = torch.Generator().manual_seed(19)
    zipf = (torch.rand(70000, generator=g, dtype=torch.float64) ** -2.0).long() - 1
    return {
        "empty": torch.empty(0, dtype=torch.int64),
        "one": torch.tensor([42]),
        "all_equal": torch.full((1000,), -7),
        "all_distinct": torch.randperm(5000, generator=g) * 977 - 2_000_000,
        "extremes": torch.tensor([INT64_MAX, INT64_MIN, 0, -1, INT64_MIN, 1, INT64_MAX, 0]),
        "few_cells": torch.tensor([5, 3, 5, 9, 3, 3, 11, 13, 9, 17, 19, 21, 23, 25, 5]),
        "small_range": torch.randint(0, 50, (20000,), generator=g),
        "zipf": zipf * 0x9E3779B97F4A7C1,
        "wide": torch.randint(INT64_MIN, INT64_MAX, (100000,), generator=g),
    }


@pytest.mark.parametrize("lib", LIBS)
@pytest.mark.parametrize("name", list(_batches()))
def test_unique_keys_matches_oracle(lib, name):
    keys = _batches()[name]
    unique, inverse, counts = LIBS[lib].unique_keys(keys)
    want = _oracle(keys)
    assert torch.equal(unique, want[0])
    assert torch.equal(inverse, want[1])
    assert torch.equal(counts, want[2])
    assert torch.equal(unique[inverse], keys)


def test_unique_keys_oracle_can_fail():
    """The oracle notices a wrong order: two keys swapped in first-occurrence order."""
    keys = torch.tensor([3, 1, 3, 2])
    unique, inverse, counts = _oracle(keys)
    assert unique.tolist() == [3, 1, 2] and inverse.tolist() == [0, 1, 0, 2]
    assert counts.tolist() == [2, 1, 1]
    assert not torch.equal(torch.tensor([1, 3, 2]), unique)


def test_unique_keys_repeated_calls_reuse_no_stale_state():
    """Calls of shrinking and growing sizes on one thread (the CPU set is reused)."""
    g = torch.Generator().manual_seed(5)
    for n in (50000, 10, 0, 3000, 50000, 1):
        keys = torch.randint(0, max(1, n // 3), (n,), generator=g)
        got = torch.ops.dynemb.unique_keys(keys)
        for a, b in zip(got, _oracle(keys)):
            assert torch.equal(a, b)


def test_unique_keys_batch_beyond_the_kept_cells():
    """A batch of > 2M keys: the CPU set is a per-call buffer, not the thread's kept one."""
    g = torch.Generator().manual_seed(7)
    keys = torch.randint(-(10**6), 10**6, (2_200_000,), generator=g)
    for a, b in zip(torch.ops.dynemb.unique_keys(keys), _oracle(keys)):
        assert torch.equal(a, b)
    small = torch.tensor([4, 4, 2])
    assert [t.tolist() for t in torch.ops.dynemb.unique_keys(small)] == [[4, 2], [0, 0, 1], [2, 1]]
