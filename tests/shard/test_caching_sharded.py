"""Caching mode on real gloo ranks: a sharded EBC / EC whose dynamic tables are caches
in front of slow tables, trained with and without prefetch (through TorchRec's
ShardedModule.prefetch hook, the input dist in the main thread, the cache fill in a
background thread), equals the unsharded uncached reference
(tests/shard/test_sharded_training.py's check). Eviction and staging are covered by
test_caching.py; here the plumbing through DMP is."""

import pytest

from tests.support.multiprocess import run_ranks
from tests.support.sharded_checks import check_sharded_training
from tests.support.sharded_workers import Case, train_sharded

CASES = [
    Case("EXACT_ROWWISE_ADAGRAD", "roundrobin", "SUM", cache_rows=16),
    Case("ADAM", "hash_roundrobin", "SUM", weighted=True, cache_rows=16, prefetch=True),
    Case("EXACT_ADAGRAD", "continuous", "NONE", cache_rows=16, prefetch=True),
]


@pytest.mark.parametrize("batch_sizes", [[3, 5]], ids=["2ranks"])
def test_sharded_caching_equals_reference(batch_sizes):
    results = run_ranks(train_sharded, len(batch_sizes), CASES, batch_sizes)
    check_sharded_training(CASES, batch_sizes, results)
