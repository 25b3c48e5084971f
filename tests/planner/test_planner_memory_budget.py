"""The planner budgets device (HBM) and host (DDR) memory of dynamic tables separately.

Planning needs no GPU: these topologies declare CUDA devices and run on the CPU.
"""

import pytest
import torch
from torchrec.distributed.planner import Topology
from torchrec.distributed.planner.storage_reservations import HeuristicalStorageReservation
from torchrec.distributed.planner.types import PlannerError, PlannerErrorType, Storage
from torchrec.modules.embedding_configs import EmbeddingBagConfig
from torchrec.modules.embedding_modules import EmbeddingBagCollection

from dynemb import DynamicEmbTableOptions
from dynemb.optimizer import EmbOptimType
from dynemb.planner import DynamicEmbeddingShardingPlanner, DynamicEmbParameterConstraints
from dynemb.planner.memory_budget import check_rank_budgets, dynamic_rank_storage
from dynemb.shard import DynamicEmbeddingBagCollectionSharder
from tests.support.planner_models import USER_ROWS_PER_RANK, by_table, entries, enumerate_options

pytestmark = pytest.mark.no_emulated_pass("planning: no table op runs")

MIB = 1 << 20
GIB = 1 << 30


@pytest.mark.parametrize(
    "device, caching, hbm, ddr",
    [
        ("cpu", False, 0, 8 * MIB),
        ("cpu", True, 0, 10 * MIB),  # the cache is in RAM too
        ("cuda", False, 2 * MIB, 6 * MIB),
        ("cuda", True, 2 * MIB, 8 * MIB),  # the whole table behind the cache
    ],
)
def test_dynamic_rank_storage_splits_values_by_local_hbm(device, caching, hbm, ddr):
    options = DynamicEmbTableOptions(global_hbm_for_values=4 * MIB, caching=caching)
    got = dynamic_rank_storage(options, 8 * MIB, device, world_size=2)
    assert got == Storage(hbm=hbm, ddr=ddr)


def test_hbm_never_exceeds_the_rows():
    options = DynamicEmbTableOptions(global_hbm_for_values=GIB)
    assert dynamic_rank_storage(options, MIB, "cuda", 2) == Storage(hbm=MIB, ddr=0)


def test_caching_table_on_a_cuda_topology_counts_the_whole_table_in_ddr():
    cache_bytes = 2 * 4096  # global; 4096 bytes (128 rows of 8 floats) per rank
    constraints = {
        "user": DynamicEmbParameterConstraints(
            use_dynamicemb=True,
            dynamicemb_options=DynamicEmbTableOptions(
                global_hbm_for_values=cache_bytes, caching=True
            ),
        )
    }
    (user,) = by_table(enumerate_options("cuda", constraints=constraints))["user"]
    total = USER_ROWS_PER_RANK * 8 * 4
    assert [s.storage for s in user.shards] == [Storage(hbm=4096, ddr=total)] * 2


def _topology(hbm_cap, ddr_cap, world_size=2):
    return Topology(world_size=world_size, compute_device="cuda", hbm_cap=hbm_cap, ddr_cap=ddr_cap)


def check(topology, *tables):
    check_rank_budgets(topology, list(tables))


def test_budget_check_names_rank_memory_and_largest_tables():
    topology = _topology(hbm_cap=GIB, ddr_cap=4 * GIB)
    check(topology, ("a", Storage(hbm=GIB // 2, ddr=2 * GIB)), ("b", Storage(hbm=GIB // 2, ddr=0)))
    with pytest.raises(PlannerError, match=r"rank 0.*device memory \(HBM\).*'a'.*hbm_cap") as e:
        check(topology, ("a", Storage(hbm=GIB, ddr=0)), ("b", Storage(hbm=1, ddr=0)))
    assert e.value.error_type is PlannerErrorType.INSUFFICIENT_STORAGE
    with pytest.raises(PlannerError, match=r"rank 0.*host memory \(DDR\).*'b': 3.000 GiB.*ddr_cap"):
        check(topology, ("a", Storage(hbm=0, ddr=2 * GIB)), ("b", Storage(hbm=0, ddr=3 * GIB)))


def test_budget_check_uses_each_ranks_own_budget():
    topology = _topology(hbm_cap=GIB, ddr_cap=4 * GIB)
    topology.devices[1].storage = Storage(hbm=GIB // 4, ddr=4 * GIB)
    with pytest.raises(PlannerError, match="rank 1"):
        check(topology, ("a", Storage(hbm=GIB // 2, ddr=0)))


def _plan(topology, options, optimizer=EmbOptimType.EXACT_SGD):
    big = [
        EmbeddingBagConfig(
            name="user", embedding_dim=64, num_embeddings=10_000_000, feature_names=["u"]
        )
    ]
    constraints = {
        "user": DynamicEmbParameterConstraints(use_dynamicemb=True, dynamicemb_options=options)
    }
    planner = DynamicEmbeddingShardingPlanner(
        big,
        topology=topology,
        storage_reservation=HeuristicalStorageReservation(percentage=0.15),
        constraints=constraints,
        debug=False,
    )
    ebc = EmbeddingBagCollection(tables=big, device="meta")
    sharder = DynamicEmbeddingBagCollectionSharder(fused_params={"optimizer": optimizer})
    return entries(planner.plan(ebc, [sharder]))["user"]


# 10M x 64 float32 rows on 2 ranks: 5_000_064 rows, 1.19 GiB of values per rank.
def test_cuda_plan_puts_global_hbm_on_the_devices_and_the_rest_on_the_host():
    options = DynamicEmbTableOptions(global_hbm_for_values=GIB)
    ps = _plan(_topology(hbm_cap=2 * GIB, ddr_cap=4 * GIB), options)
    assert ps.dynamicemb_options.local_hbm_for_values == GIB // 2


@pytest.mark.parametrize(
    "global_hbm, hbm_cap, ddr_cap, memory",
    [
        (4 * GIB, GIB, 8 * GIB, "device memory"),  # 1.19 GiB of rows per rank in HBM
        (GIB, 8 * GIB, GIB // 2, "host memory"),  # 0.69 GiB per rank left for the host
    ],
)
def test_cuda_plan_fails_clearly_when_a_budget_is_short(global_hbm, hbm_cap, ddr_cap, memory):
    options = DynamicEmbTableOptions(global_hbm_for_values=global_hbm)
    with pytest.raises(PlannerError, match=f"rank 0.*{memory}.*'user'"):
        _plan(_topology(hbm_cap=hbm_cap, ddr_cap=ddr_cap), options)


def test_cuda_plan_with_everything_on_the_host_needs_no_hbm():
    options = DynamicEmbTableOptions(global_hbm_for_values=0, embedding_dtype=torch.float16)
    ps = _plan(_topology(hbm_cap=GIB // 4, ddr_cap=2 * GIB), options)
    assert ps.dynamicemb_options.local_hbm_for_values == 0
