"""DynamicEmbeddingShardingPlanner: plans of a model with dynamic and ordinary tables.

The filled per-rank options are checked against values computed by hand (below, per
world size), the plan entries against TorchRec's row-wise layout (the model:
tests/support/planner_models.py).
"""

import copy
import dataclasses
import math
import pickle

import pytest
import torch
from torchrec.distributed.planner import ParameterConstraints
from torchrec.distributed.planner.storage_reservations import HeuristicalStorageReservation
from torchrec.distributed.planner.types import PlannerError
from torchrec.distributed.types import EnumerableShardingSpec, ParameterSharding
from torchrec.modules.embedding_configs import EmbeddingBagConfig
from torchrec.modules.embedding_modules import EmbeddingBagCollection

from dynemb import DynamicEmbInitializerArgs, DynamicEmbInitializerMode, DynamicEmbTableOptions
from dynemb.optimizer import EmbOptimType
from dynemb.planner import (
    DynamicEmbeddingEnumerator,
    DynamicEmbeddingShardingPlanner,
    DynamicEmbParameterConstraints,
    DynamicEmbParameterSharding,
)
from dynemb.planner.rank_options import FILLED_FIELDS
from dynemb.shard import DynamicEmbeddingBagCollectionSharder
from tests.support.planner_models import (
    DYNAMIC_KERNEL,
    DYNAMIC_TABLES,
    ROW_WISE,
    Model,
    all_configs,
    cpu_topology,
    entries,
    make_constraints,
    sharders,
)

pytestmark = pytest.mark.no_emulated_pass("planning: no table op runs")


# Hand-computed per world size (ws):
#   user  (1000 rows, bucket 128, init 100, 1001 HBM bytes): rows/rank 1000 | 500 | 334
#         -> max 1024 | 512 | 384 (whole 128-buckets); init 100 -> one bucket = 128;
#         local_hbm ceil(1001 / ws) = 1001 | 501 | 334.
#   item  (40 rows, default bucket 128): rows/rank 40 | 20 | 14 -> one whole 128-slot
#         bucket, as in DynamicEmb: max = init = 128.
#   query (500 rows, bucket 64): rows/rank 500 | 250 | 167 -> max 512 | 256 | 192.
EXPECTED = {
    # table: {ws: (bucket_capacity, max_capacity, init_capacity, local_hbm_for_values)}
    "user": {1: (128, 1024, 128, 1001), 2: (128, 512, 128, 501), 3: (128, 384, 128, 334)},
    "item": {1: (128, 128, 128, 0), 2: (128, 128, 128, 0), 3: (128, 128, 128, 0)},
    "query": {1: (64, 512, 512, 0), 2: (64, 256, 256, 0), 3: (64, 192, 192, 0)},
}
DIMS = {"user": 8, "item": 16, "query": 8}
NUM_EMBEDDINGS = {"user": 1000, "item": 40, "query": 500, "country": 300, "lang": 100}


@pytest.fixture(scope="module", params=[1, 2, 3], ids=lambda ws: f"ws{ws}")
def planned(request):
    ws = request.param
    constraints = make_constraints()
    before = copy.deepcopy(constraints)
    planner = DynamicEmbeddingShardingPlanner(
        all_configs(), topology=cpu_topology(ws), constraints=constraints, debug=False
    )
    plan = planner.plan(Model(), sharders())
    return ws, plan, constraints, before


def test_dynamic_tables_get_filled_rank_options(planned):
    ws, plan, _, _ = planned
    got = entries(plan)
    for name in DYNAMIC_TABLES:
        ps = got[name]
        assert type(ps) is DynamicEmbParameterSharding, name
        o = ps.dynamicemb_options
        assert (
            o.bucket_capacity,
            o.max_capacity,
            o.init_capacity,
            o.local_hbm_for_values,
        ) == EXPECTED[name][ws], name
        assert o.dim == DIMS[name]


def test_uniform_bounds_default_to_inverse_sqrt_num_embeddings(planned):
    _, plan, _, _ = planned
    got = entries(plan)
    user = got["user"].dynamicemb_options.initializer_args
    assert (user.lower, user.upper) == (-math.sqrt(1 / 1000), math.sqrt(1 / 1000))
    item = got["item"].dynamicemb_options.initializer_args
    assert (item.lower, item.upper) == (-math.sqrt(1 / 40), math.sqrt(1 / 40))
    # A bound the user set is kept; only the unset one is filled.
    query = got["query"].dynamicemb_options.initializer_args
    assert (query.lower, query.upper) == (-0.5, math.sqrt(1 / 500))


def test_dynamic_entries_have_row_wise_spec_over_all_ranks(planned):
    ws, plan, _, _ = planned
    got = entries(plan)
    for name in DYNAMIC_TABLES:
        ps = got[name]
        assert (ps.sharding_type, ps.compute_kernel) == (ROW_WISE, DYNAMIC_KERNEL)
        assert ps.ranks == list(range(ws))
        spec = ps.sharding_spec
        assert isinstance(spec, EnumerableShardingSpec)
        assert [s.placement.rank() for s in spec.shards] == list(range(ws))
        assert sum(s.shard_sizes[0] for s in spec.shards) == NUM_EMBEDDINGS[name]
        assert {s.shard_sizes[1] for s in spec.shards} == {DIMS[name]}
        offsets = [s.shard_offsets[0] for s in spec.shards]
        assert offsets == sorted(offsets) and offsets[0] == 0


def test_ordinary_tables_keep_torchrec_entries(planned):
    _, plan, _, _ = planned
    got = entries(plan)
    assert set(got) == set(NUM_EMBEDDINGS)
    for name in ("country", "lang"):
        assert type(got[name]) is ParameterSharding, name
        assert got[name].compute_kernel != DYNAMIC_KERNEL
        assert got[name].compute_kernel in ("fused", "dense")


def test_user_options_are_filled_in_place(planned):
    # As DynamicEmb's planner: the user's options get the per-rank values; the plan
    # entry keeps its own copy (no two plans share option objects).
    _, plan, constraints, before = planned
    got = entries(plan)
    for name in DYNAMIC_TABLES:
        user_options = constraints[name].dynamicemb_options
        entry = got[name].dynamicemb_options
        assert entry is not user_options
        for field in dataclasses.fields(DynamicEmbTableOptions):
            given = getattr(before[name].dynamicemb_options, field.name)
            want = getattr(entry, field.name) if field.name in FILLED_FIELDS else given
            assert getattr(user_options, field.name) == want, (name, field.name)
        assert (user_options.bucket_capacity, user_options.max_capacity, user_options.init_capacity,
                user_options.local_hbm_for_values) == EXPECTED[name][planned[0]]  # fmt: skip


def test_plan_pickles(planned):
    # collective_plan broadcasts the plan with broadcast_object_list.
    _, plan, _, _ = planned
    again = pickle.loads(pickle.dumps(plan))
    assert entries(again) == entries(plan)
    assert type(entries(again)["user"]) is DynamicEmbParameterSharding


def test_plans_do_not_share_options():
    planner = DynamicEmbeddingShardingPlanner(
        all_configs(), topology=cpu_topology(2), constraints=make_constraints(), debug=False
    )
    first = entries(planner.plan(Model(), sharders()))["user"].dynamicemb_options
    second = entries(planner.plan(Model(), sharders()))["user"].dynamicemb_options
    assert first == second and first is not second
    assert first.initializer_args is not second.initializer_args


@pytest.mark.parametrize(
    "init_capacity, expected",
    [
        (1, 128),  # below one bucket: one bucket
        (130, 256),  # rounded up to whole buckets
        (384, 384),  # already aligned
        (10**6, 512),  # above max_capacity: max_capacity
    ],
)
def test_init_capacity_is_aligned_and_clamped(init_capacity, expected):
    # 1000 rows on 2 ranks: 500 per rank, max_capacity 512 (four 128-buckets).
    constraints = {
        "user": DynamicEmbParameterConstraints(
            use_dynamicemb=True,
            dynamicemb_options=DynamicEmbTableOptions(init_capacity=init_capacity),
        )
    }
    planner = DynamicEmbeddingShardingPlanner(
        all_configs(), topology=cpu_topology(2), constraints=constraints, debug=False
    )
    o = entries(planner.plan(Model(), sharders()))["user"].dynamicemb_options
    assert (o.max_capacity, o.init_capacity) == (512, expected)


def test_non_uniform_initializer_keeps_its_bounds():
    normal = DynamicEmbInitializerArgs(mode=DynamicEmbInitializerMode.NORMAL, std_dev=0.1)
    constraints = {
        "user": DynamicEmbParameterConstraints(
            use_dynamicemb=True,
            dynamicemb_options=DynamicEmbTableOptions(initializer_args=normal),
        )
    }
    planner = DynamicEmbeddingShardingPlanner(
        all_configs(), topology=cpu_topology(2), constraints=constraints, debug=False
    )
    args = entries(planner.plan(Model(), sharders()))["user"].dynamicemb_options.initializer_args
    assert args == normal and args is not normal


def test_accepts_custom_topology_reservation_and_enumerator():
    topology = cpu_topology(2, hbm_cap=0, ddr_cap=4 << 30, ddr_mem_bw=50e9 / 1000)
    constraints = make_constraints()
    enumerator = DynamicEmbeddingEnumerator(
        topology=topology, batch_size=256, constraints=constraints
    )
    planner = DynamicEmbeddingShardingPlanner(
        all_configs(),
        topology=topology,
        batch_size=256,
        enumerator=enumerator,
        storage_reservation=HeuristicalStorageReservation(percentage=0.15),
        constraints=constraints,
        debug=False,
    )
    got = entries(planner.plan(Model(), sharders()))
    assert {n for n, ps in got.items() if type(ps) is DynamicEmbParameterSharding} == set(
        DYNAMIC_TABLES
    )
    assert got["user"].dynamicemb_options.max_capacity == 512


@pytest.mark.parametrize(
    "dtype, optimizer, ddr_gb, fits",
    [
        # 10M x 64 rows on 2 ranks: 5_000_064 rows per rank (whole 128-buckets).
        (torch.float32, EmbOptimType.EXACT_SGD, 2, True),  # 1.28 GB per rank
        (torch.float32, EmbOptimType.EXACT_SGD, 1, False),
        (torch.float16, EmbOptimType.EXACT_SGD, 1, True),  # 0.64 GB: TorchRec's own
        (torch.float32, EmbOptimType.ADAM, 2, False),  # 3.84 GB (estimate would be 1.28)
        (torch.float32, EmbOptimType.ADAM, 5, True),
    ],
)
def test_dynamic_table_storage_counts_against_ddr_cap(dtype, optimizer, ddr_gb, fits):
    big = [
        EmbeddingBagConfig(
            name="user", embedding_dim=64, num_embeddings=10_000_000, feature_names=["u"]
        )
    ]
    options = DynamicEmbTableOptions(embedding_dtype=dtype)
    constraints = {
        "user": DynamicEmbParameterConstraints(use_dynamicemb=True, dynamicemb_options=options)
    }
    planner = DynamicEmbeddingShardingPlanner(
        big,
        topology=cpu_topology(2, ddr_cap=ddr_gb << 30),
        storage_reservation=HeuristicalStorageReservation(percentage=0.15),
        constraints=constraints,
        debug=False,
    )
    ebc = EmbeddingBagCollection(tables=big, device="meta")
    sharder = DynamicEmbeddingBagCollectionSharder(fused_params={"optimizer": optimizer})
    if fits:
        assert type(entries(planner.plan(ebc, [sharder]))["user"]) is DynamicEmbParameterSharding
    else:
        with pytest.raises(PlannerError, match="insufficient storage"):
            planner.plan(ebc, [sharder])


def test_collective_plan_without_process_group_raises():
    planner = DynamicEmbeddingShardingPlanner(
        all_configs(), topology=cpu_topology(2), constraints=make_constraints(), debug=False
    )
    with pytest.raises(RuntimeError, match="init_process_group"):
        planner.collective_plan(Model(), sharders())


def test_constraints_defaults_and_hash():
    a, b = DynamicEmbParameterConstraints(), DynamicEmbParameterConstraints()
    assert isinstance(a, ParameterConstraints) and a.use_dynamicemb is False
    assert a.dynamicemb_options == DynamicEmbTableOptions()
    assert a.dynamicemb_options is not b.dynamicemb_options
    # TorchRec hashes constraints to fingerprint a planner's inputs.
    assert hash(a) == hash(b)
    other = DynamicEmbParameterConstraints(
        dynamicemb_options=DynamicEmbTableOptions(bucket_capacity=64)
    )
    assert hash(other) != hash(a)
    assert hash(DynamicEmbParameterConstraints(use_dynamicemb=True)) != hash(a)
