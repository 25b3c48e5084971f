"""collective_plan on 2 real gloo ranks: every rank gets rank 0's plan.

Rank 1 builds its planner with other options (bucket_capacity 64, not 128): it can
only end up with rank 0's values if the plan was broadcast. A rank that hangs is
killed at the deadline by tests/support/multiprocess.py and the test fails.
"""

import pytest

from dynemb import DynamicEmbTableOptions
from dynemb.planner import DynamicEmbeddingShardingPlanner, DynamicEmbParameterConstraints
from tests.support.multiprocess import run_ranks
from tests.support.planner_models import Model, all_configs, cpu_topology, entries, sharders

pytestmark = pytest.mark.no_emulated_pass("planning over spawned ranks: no table op runs")

WORLD_SIZE = 2
RANK_BUCKET = {0: 128, 1: 64}


def _plan_on_rank(rank: int, world_size: int):
    options = DynamicEmbTableOptions(bucket_capacity=RANK_BUCKET[rank])
    constraints = {
        "user": DynamicEmbParameterConstraints(use_dynamicemb=True, dynamicemb_options=options)
    }
    planner = DynamicEmbeddingShardingPlanner(
        all_configs(), topology=cpu_topology(world_size), constraints=constraints, debug=False
    )
    return planner.collective_plan(Model(), sharders())


def test_collective_plan_broadcasts_rank_zero_plan():
    results = run_ranks(_plan_on_rank, WORLD_SIZE, timeout=120)
    plans = [entries(value) for value in results]
    assert plans[0] == plans[1]
    for plan in plans:
        # 1000 rows on 2 ranks with rank 0's 128-slot buckets: 512 rows per rank.
        options = plan["user"].dynamicemb_options
        assert (options.bucket_capacity, options.max_capacity) == (128, 512)
