"""DYNAMICEMB_API.md section 4: the planner fills the user's DynamicEmbTableOptions in
place (initializer bounds, bucket_capacity, max_capacity, local_hbm_for_values,
init_capacity, dim, index_type, embedding_dtype), as DynamicEmb's does; one options
object shared by tables of different sizes, and planning again, are dynemb's choices
(DynamicEmb_APIs.md, DynamicEmbeddingShardingPlanner)."""

import dataclasses
import math

import pytest
import torch
from torchrec import EmbeddingCollection, EmbeddingConfig
from torchrec.distributed.planner import Topology

from dynemb import (
    DynamicEmbInitializerArgs,
    DynamicEmbInitializerMode,
    DynamicEmbTableOptions,
    get_sharded_table_capacity,
)
from dynemb.get_planner import get_planner
from dynemb.planner import DynamicEmbeddingShardingPlanner, DynamicEmbParameterConstraints
from dynemb.shard import DynamicEmbeddingCollectionSharder
from tests.support.multiprocess import run_ranks

pytestmark = pytest.mark.no_emulated_pass("planning: no table op runs")

ROWS = {"big": 1000, "small": 300}


def _configs():
    return [
        EmbeddingConfig(name=n, embedding_dim=8, num_embeddings=r, feature_names=[f"f_{n}"])
        for n, r in ROWS.items()
    ]


def _plan(options: dict, world_size: int):
    """Plans the dynamic tables of ``options`` ({table: DynamicEmbTableOptions}) on a
    CPU topology of ``world_size`` ranks; returns {table: the plan entry's options}."""
    configs = _configs()
    constraints = {
        name: DynamicEmbParameterConstraints(use_dynamicemb=True, dynamicemb_options=o)
        for name, o in options.items()
    }
    planner = DynamicEmbeddingShardingPlanner(
        configs, topology=Topology(world_size=world_size, compute_device="cpu"),
        constraints=constraints, debug=False,
    )  # fmt: skip
    module = EmbeddingCollection(tables=configs, device=torch.device("meta"))
    plan = planner.plan(module, [DynamicEmbeddingCollectionSharder()])
    return {name: ps.dynamicemb_options for name, ps in plan.plan[""].items() if name in options}


@pytest.mark.parametrize("world_size", [1, 2, 3])
@pytest.mark.parametrize("init_capacity, want_init", [(None, "max"), (100, 128)])
def test_the_users_options_get_the_per_rank_values(world_size, init_capacity, want_init):
    options = DynamicEmbTableOptions(
        bucket_capacity=128, global_hbm_for_values=1001, init_capacity=init_capacity
    )
    entry = _plan({"big": options}, world_size)["big"]
    config = _configs()[0]
    max_capacity = get_sharded_table_capacity(config, world_size, 128)
    assert options.max_capacity == max_capacity == entry.max_capacity
    assert options.local_hbm_for_values == math.ceil(1001 / world_size)
    assert options.init_capacity == (max_capacity if want_init == "max" else want_init)
    assert (options.dim, options.bucket_capacity) == (8, 128)
    assert (options.index_type, options.embedding_dtype) == (torch.int64, torch.float32)
    bound = math.sqrt(1 / 1000)  # UNIFORM bounds left None: +-sqrt(1 / num_embeddings)
    assert (options.initializer_args.lower, options.initializer_args.upper) == (-bound, bound)
    assert entry is not options  # the plan keeps its own copy


def test_a_value_already_filled_is_not_replaced():
    args = DynamicEmbInitializerArgs(mode=DynamicEmbInitializerMode.CONSTANT, value=0.1)
    options = DynamicEmbTableOptions(initializer_args=args, dim=8)
    _plan({"big": options}, 2)
    assert options.initializer_args is args  # no bound to fill: the user's object stays
    assert options.max_capacity == 512


def test_get_planner_fills_the_options_of_its_dict():
    options = {"big": DynamicEmbTableOptions(global_hbm_for_values=4096)}
    configs = _configs()
    planner = get_planner(configs, set(), options, torch.device("cpu"))
    module = EmbeddingCollection(tables=configs, device=torch.device("meta"))
    planner.plan(module, [DynamicEmbeddingCollectionSharder()])
    assert (options["big"].max_capacity, options["big"].local_hbm_for_values) == (1024, 4096)


def test_one_object_shared_by_tables_of_different_sizes_gets_what_they_agree_on():
    shared = DynamicEmbTableOptions(bucket_capacity=128, global_hbm_for_values=512)
    with pytest.warns(UserWarning, match=r"\['big', 'small'\] share one .*'max_capacity'"):
        entries = _plan({"big": shared, "small": shared}, 1)
    # Per table in its plan entry; on the shared object only what both tables share.
    assert (entries["big"].max_capacity, entries["small"].max_capacity) == (1024, 384)
    assert shared.max_capacity is None and shared.init_capacity is None
    assert (shared.dim, shared.local_hbm_for_values, shared.bucket_capacity) == (8, 512, 128)
    # The initializer bounds depend on num_embeddings: the user's args are kept.
    assert shared.initializer_args.lower is None


@pytest.mark.parametrize("first, then", [(1, 3), (3, 1), (2, 2)])
def test_planning_again_starts_from_the_users_values(first, then):
    # A small table's values depend on the world size; init_capacity None follows
    # max_capacity. The second plan must see the user's values, not the first plan's.
    options = DynamicEmbTableOptions(bucket_capacity=128)
    _plan({"small": options}, first)
    entry = _plan({"small": options}, then)["small"]
    fresh = DynamicEmbTableOptions(bucket_capacity=128)
    want = _plan({"small": fresh}, then)["small"]
    for field in dataclasses.fields(DynamicEmbTableOptions):
        got = (getattr(entry, field.name), getattr(options, field.name))
        assert got == (getattr(want, field.name), getattr(fresh, field.name)), field.name


def test_a_value_set_after_planning_is_the_users():
    options = DynamicEmbTableOptions(bucket_capacity=128)
    _plan({"big": options}, 1)
    assert options.init_capacity == 1024  # filled: max_capacity
    options.init_capacity = 200  # the user's now: rounded up to buckets by the next plan
    assert _plan({"big": options}, 1)["big"].init_capacity == 256
    assert options.init_capacity == 256


def _collective(rank: int, world_size: int) -> tuple:
    import torch.distributed as dist

    options = {"big": DynamicEmbTableOptions(global_hbm_for_values=1000)}
    configs = _configs()
    planner = get_planner(configs, set(), options, torch.device("cpu"))
    module = EmbeddingCollection(tables=configs, device=torch.device("meta"))
    planner.collective_plan(module, [DynamicEmbeddingCollectionSharder()], dist.group.WORLD)
    o = options["big"]
    return o.max_capacity, o.local_hbm_for_values, o.init_capacity, o.dim


def test_collective_plan_fills_the_options_on_every_rank():
    # 1000 rows over 2 ranks: 500 a rank, 512 with 128-slot buckets; 1000 bytes: 500 a rank.
    assert run_ranks(_collective, 2, timeout=120) == [(512, 500, 512, 8)] * 2
