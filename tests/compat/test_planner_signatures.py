"""DYNAMICEMB_API.md section 6: planner, constraints, plan entries and sharders."""

import dataclasses
import inspect

import pytest
import torch
import torch.distributed as dist
from torchrec.distributed.embedding_types import EmbeddingComputeKernel
from torchrec.distributed.planner import ParameterConstraints, Topology
from torchrec.modules.embedding_configs import EmbeddingConfig
from torchrec.modules.embedding_modules import EmbeddingCollection

from dynemb import DynamicEmbEvictStrategy, DynamicEmbScoreStrategy, DynamicEmbTableOptions
from dynemb.planner import (
    DynamicEmbeddingEnumerator,
    DynamicEmbeddingShardingPlanner,
    DynamicEmbParameterConstraints,
    DynamicEmbParameterSharding,
)
from dynemb.shard import DynamicEmbeddingBagCollectionSharder, DynamicEmbeddingCollectionSharder

pytestmark = pytest.mark.no_emulated_pass("planner signatures: Python only")


def defaults(fn) -> dict:
    return {
        name: p.default
        for name, p in inspect.signature(fn).parameters.items()
        if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    }


def test_enumerator_signature():
    assert defaults(DynamicEmbeddingEnumerator) == {
        "topology": inspect.Parameter.empty,
        "batch_size": 512,
        "constraints": None,
        "estimator": None,
        "use_exact_enumerate_order": False,
    }


def test_enumerator_without_batch_size():
    enumerator = DynamicEmbeddingEnumerator(topology=Topology(world_size=2, compute_device="cpu"))
    assert enumerator._batch_size == 512  # TorchRec's attribute


def test_planner_signature():
    assert defaults(DynamicEmbeddingShardingPlanner) == {
        "eb_configs": inspect.Parameter.empty,
        "topology": None,
        "batch_size": None,
        "enumerator": None,
        "storage_reservation": None,
        "proposer": None,
        "partitioner": None,
        "performance_model": None,
        "stats": None,
        "constraints": None,
        "debug": True,
        "ordinary_tables_as_dynamic": False,  # dynemb extra (Differences from DynamicEmb)
    }
    assert defaults(DynamicEmbeddingShardingPlanner.collective_plan)["pg"] in (
        None,
        dist.GroupMember.WORLD,
    )


def test_constraints_fields():
    c = DynamicEmbParameterConstraints()
    assert isinstance(c, ParameterConstraints)
    assert c.use_dynamicemb is False
    assert isinstance(c.dynamicemb_options, DynamicEmbTableOptions)


def test_parameter_sharding_defaults():
    fields = {f.name: f for f in dataclasses.fields(DynamicEmbParameterSharding)}
    assert fields["compute_kernel"].default == EmbeddingComputeKernel.CUSTOMIZED_KERNEL.value
    assert fields["customized_compute_kernel"].default == "DynamicEmb"
    assert fields["dist_type"].default == "roundrobin"
    ps = DynamicEmbParameterSharding(sharding_type="row_wise")
    assert ps.compute_kernel == "customized_kernel"
    assert isinstance(ps.dynamicemb_options, DynamicEmbTableOptions)


def test_sharder_signatures():
    assert defaults(DynamicEmbeddingCollectionSharder) == {
        "fused_params": None,
        "qcomm_codecs_registry": None,
        "use_index_dedup": False,
    }
    bag = defaults(DynamicEmbeddingBagCollectionSharder)
    assert bag["fused_params"] is None and bag["qcomm_codecs_registry"] is None
    assert "use_index_dedup" not in bag


def _plan_options(options: DynamicEmbTableOptions, rows=100, world=2):
    config = EmbeddingConfig(name="t", embedding_dim=8, num_embeddings=rows, feature_names=["f"])
    planner = DynamicEmbeddingShardingPlanner(
        [config],
        topology=Topology(world_size=world, compute_device="cpu"),
        constraints={
            "t": DynamicEmbParameterConstraints(use_dynamicemb=True, dynamicemb_options=options)
        },
    )
    module = EmbeddingCollection(tables=[config], device=torch.device("meta"))
    plan = planner.plan(module, [DynamicEmbeddingCollectionSharder()])
    return plan.plan[""]["t"]


def test_plan_fills_dynamicembs_fields():
    entry = _plan_options(DynamicEmbTableOptions(score_strategy=DynamicEmbScoreStrategy.STEP))
    o = entry.dynamicemb_options
    assert entry.dist_type == "roundrobin" and entry.compute_kernel == "customized_kernel"
    # 100 rows over 2 ranks: 50 a rank, one whole 128-slot bucket (get_sharded_table_capacity).
    assert (o.dim, o.max_capacity, o.init_capacity, o.bucket_capacity) == (8, 128, 128, 128)
    assert o.embedding_dtype == torch.float32 and o.index_type == torch.int64
    assert o.evict_strategy == DynamicEmbEvictStrategy.CUSTOMIZED  # STEP -> CUSTOMIZED


def test_plan_max_bucket_capacity_means_one_bucket_per_rank():
    from dynemb import MAX_BUCKET_CAPACITY

    o = _plan_options(DynamicEmbTableOptions(bucket_capacity=MAX_BUCKET_CAPACITY), rows=1000)
    assert o.dynamicemb_options.max_capacity == 512  # 500 rows per rank -> one 512-slot bucket
    assert o.dynamicemb_options.bucket_capacity == 512


def test_plan_warns_when_evict_strategy_disagrees():
    options = DynamicEmbTableOptions(
        score_strategy=DynamicEmbScoreStrategy.TIMESTAMP,
        evict_strategy=DynamicEmbEvictStrategy.LFU,
    )
    with pytest.warns(UserWarning, match="evict_strategy=.*LFU.*ignored"):
        entry = _plan_options(options)
    assert entry.dynamicemb_options.evict_strategy == DynamicEmbEvictStrategy.LRU
