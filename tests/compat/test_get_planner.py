"""DYNAMICEMB_API.md section 13: dynemb.get_planner.get_planner, on one process and over 2
gloo ranks: data-parallel, dynamic and ordinary row-wise tables."""

import pytest
import torch
import torch.distributed as dist
from torchrec import EmbeddingCollection, EmbeddingConfig

from dynemb.dynamicemb_config import DynamicEmbTableOptions
from dynemb.get_planner import get_planner
from dynemb.planner import DynamicEmbeddingShardingPlanner, DynamicEmbParameterSharding
from dynemb.shard import DynamicEmbeddingCollectionSharder
from tests.support.multiprocess import run_ranks

CONFIGS = [
    EmbeddingConfig(name=n, embedding_dim=8, num_embeddings=100, feature_names=[f"f_{n}"])
    for n in ("country", "item", "user")
]


def _plan(world_size: int) -> dict:
    planner = get_planner(
        CONFIGS, {"country"}, {"item": DynamicEmbTableOptions()}, torch.device("cpu")
    )
    module = EmbeddingCollection(tables=CONFIGS, device=torch.device("meta"))
    sharders = [DynamicEmbeddingCollectionSharder()]
    if dist.is_initialized():
        plan = planner.collective_plan(module, sharders, dist.group.WORLD)
    else:
        plan = planner.plan(module, sharders)
    return {
        name: (
            p.sharding_type,
            p.compute_kernel,
            isinstance(p, DynamicEmbParameterSharding),
            len(p.ranks or []),
            p.dynamicemb_options.max_capacity if isinstance(p, DynamicEmbParameterSharding) else 0,
        )
        for name, p in plan.plan[""].items()
    } | {"planner": isinstance(planner, DynamicEmbeddingShardingPlanner)}


def _plan_on_rank(rank: int, world_size: int) -> dict:
    return _plan(world_size)


def test_signature_defaults():
    import inspect

    params = inspect.signature(get_planner).parameters
    assert list(params) == [
        "eb_configs", "data_parallel_embedding_table_names", "dynamicemb_options_dict",
        "device", "pipeline_type", "ddr_cap", "intra_host_bw", "inter_host_bw",
    ]  # fmt: skip
    assert params["pipeline_type"].default == "none"
    assert params["ddr_cap"].default == 512 * 1024**3
    assert (params["intra_host_bw"].default, params["inter_host_bw"].default) == (450e9, 25e9)


@pytest.mark.no_emulated_pass("planning runs no table op")
@pytest.mark.parametrize("world_size", [1, 2])
def test_tables_get_their_kind(world_size):
    for result in run_ranks(_plan_on_rank, world_size, timeout=150):
        assert result["planner"]
        assert result["country"][:3] == ("data_parallel", "dense", False)
        assert result["item"][:4] == ("row_wise", "customized_kernel", True, world_size)
        assert result["item"][4] >= -(-100 // world_size)  # rows per rank
        assert result["user"][0] == "row_wise" and not result["user"][2]


def test_without_process_group_plans_one_rank():
    result = _plan(1)
    assert result["item"][:4] == ("row_wise", "customized_kernel", True, 1)


@pytest.mark.parametrize(
    "args, error, message",
    [
        (({"nope"}, {}), ValueError, r"`data_parallel_embedding_table_names` names \['nope'\]"),
        ((set(), {"nope": DynamicEmbTableOptions()}), ValueError, r"`dynamicemb_options_dict` names \['nope'\]"),
        (({"item"}, {"item": DynamicEmbTableOptions()}), ValueError, r"\['item'\] are both data-parallel and dynamic"),
    ],
)  # fmt: skip
def test_bad_table_names(args, error, message):
    with pytest.raises(error, match=message):
        get_planner(CONFIGS, *args, torch.device("cpu"))


def test_bad_device():
    with pytest.raises(TypeError, match="`device` must be a torch.device, got 3"):
        get_planner(CONFIGS, set(), {}, 3)
