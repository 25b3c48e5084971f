"""DynamicEmb's sizing combinations through its public flow: per table
``global_hbm_for_values = ratio * get_table_value_bytes(...)``, ``get_planner``,
``collective_plan``, DistributedModelParallel; then, on the user's own options,
``max_capacity == get_sharded_table_capacity(config, world_size, bucket_capacity)``,
``local_hbm_for_values == ceil(global_hbm_for_values / world_size)``, ``dim`` and
``embedding_dtype`` filled, a cache exactly when ``caching``, and one lookup per table.

Every combination is built in one rank process (two for the 2-rank subset); each
combination is its own test case."""

import pytest

from tests.support.alignment_workers import (
    TABLES,
    check_combinations,
    combination_id,
    combinations,
)
from tests.support.multiprocess import run_ranks

pytestmark = pytest.mark.no_emulated_pass(
    "sizing through the planner and DMP, the same on every executor; the one lookup "
    "per table runs in rank processes, and lookups run on both executors elsewhere"
)

COMBINATIONS = combinations()
# Over 2 ranks: Adam, dim 16, a quarter of the table in the fast tier.
TWO_RANKS = [c for c in COMBINATIONS if c[3].name == "ADAM" and c[4] == 0.25 and c[5] == 16]


@pytest.fixture(scope="module")
def one_rank():
    (result,) = run_ranks(check_combinations, 1, COMBINATIONS, timeout=900)
    return result


@pytest.fixture(scope="module")
def two_ranks():
    results = run_ranks(check_combinations, 2, TWO_RANKS, timeout=600)
    return {k: [p for r in results for p in r[k]] for k in results[0]}


@pytest.mark.parametrize("combo", COMBINATIONS, ids=combination_id)
def test_one_rank(one_rank, combo):
    assert one_rank[combination_id(combo)] == []


@pytest.mark.parametrize("combo", TWO_RANKS, ids=combination_id)
def test_two_ranks(two_ranks, combo):
    assert two_ranks[combination_id(combo)] == []


def test_the_grid():
    # 2 caching x 2 training x 3 buckets x 3 optimizers x 3 HBM ratios x 2 dims x 5 models,
    # less caching with no HBM (3 x 3 x 2 x 5 x 2 of them).
    assert len(COMBINATIONS) == 2 * 2 * 3 * 3 * 3 * 2 * len(TABLES) - 2 * 3 * 3 * 2 * 5
    assert len(TWO_RANKS) == 2 * 2 * 3 * len(TABLES)
