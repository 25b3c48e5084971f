"""Keys chosen by where a table puts them: their home bucket and, under NO_EVICTION,
their second bucket (csrc/core/hash.h; tests/support/reference.py second_bucket_of)."""

import torch

from dynemb import _ops
from tests.support import reference as ref


def keys_of_buckets(n, num_buckets, home, second=None, seed=0):
    """n random keys homed at bucket `home` of a table of num_buckets buckets (home 0:
    at bucket 0 of any smaller table too) and, with `second`, whose second bucket there
    is `second`."""
    g = torch.Generator().manual_seed(seed)
    found = []
    while len(found) < n:
        cand = torch.randint(-(2**63), 2**63 - 1, (1 << 16,), generator=g)
        bucket, _ = _ops.hash_keys(cand, num_buckets)
        found += [
            k
            for k in cand[bucket == home].tolist()
            if second is None or ref.second_bucket_of(k, num_buckets) == second
        ]
    return torch.tensor(found[:n], dtype=torch.int64)
