"""Rank-side code of tests/warm_start/test_warm_start_sharded.py: a model with a dynamic
table sharded row-wise ("rw") and one column-wise ("cw"), warm-started from static
weights or from a checkpoint, on real gloo ranks; and the static model it must equal."""

import dataclasses

import torch
import torch.distributed as dist
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor
from torchrec.distributed.model_parallel import DistributedModelParallel
from torchrec.distributed.planner import Topology
from torchrec.distributed.sharding_plan import (
    column_wise,
    construct_module_sharding_plan,
    row_wise,
)
from torchrec.distributed.types import ShardingEnv, ShardingPlan

from dynemb import DynamicEmbDump, DynamicEmbTableOptions
from dynemb.optimizer import EmbOptimType
from dynemb.planner import (
    DynamicEmbeddingShardingPlanner,
    DynamicEmbParameterConstraints,
    DynamicEmbParameterSharding,
)
from dynemb.shard import DynamicEmbeddingBagCollectionSharder
from dynemb.warm_start import WarmStart
from tests.support.counting import CountingSource
from tests.support.sharded_workers import dynamic_tables
from tests.support.table_wise_workers import entries

ROWS = 40
DIMS = {"rw": 4, "cw": 8}
FEATURES = ["f0", "f1"]  # f0 reads rw, f1 reads cw
BATCH = 4  # samples per rank
OPTIMIZER = EmbOptimType.EXACT_ROWWISE_ADAGRAD  # one state column: dumps carry state


def static_weights() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(11)
    return {name: torch.randn(ROWS, dim, generator=g) for name, dim in DIMS.items()}


def _configs() -> list[EmbeddingBagConfig]:
    return [
        EmbeddingBagConfig(name=name, embedding_dim=dim, num_embeddings=ROWS, feature_names=[f])
        for (name, dim), f in zip(DIMS.items(), FEATURES)
    ]


def static_model(weights: dict) -> EmbeddingBagCollection:
    model = EmbeddingBagCollection(tables=_configs())
    for name, w in weights.items():
        model.embedding_bags[name].weight.data.copy_(w)
    return model


def global_batch(batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(lengths (features, batch), keys)``: feature-major ids below ROWS."""
    g = torch.Generator().manual_seed(21)
    lengths = torch.randint(1, 4, (len(FEATURES), batch_size), generator=g)
    return lengths, torch.randint(0, ROWS, (int(lengths.sum()),), generator=g)


def kjt(lengths, keys, start: int, stop: int) -> KeyedJaggedTensor:
    """Samples [start, stop) of the global batch."""
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.flatten().cumsum(0)])
    batch = lengths.shape[1]
    parts = [keys[offsets[f * batch + start] : offsets[f * batch + stop]] for f in range(2)]
    return KeyedJaggedTensor(keys=FEATURES, values=torch.cat(parts),
                             lengths=lengths[:, start:stop].flatten())  # fmt: skip


def _options(name: str, source) -> DynamicEmbTableOptions:
    return DynamicEmbTableOptions(dim=DIMS[name], max_capacity=256, bucket_capacity=16,
                                  dist_type="hash_roundrobin", warm_start=source)  # fmt: skip


def sharded_model(world_size: int, sources: dict) -> DistributedModelParallel:
    module = EmbeddingBagCollection(tables=_configs(), device=torch.device("meta"))
    sharder = DynamicEmbeddingBagCollectionSharder(
        fused_params={"optimizer": OPTIMIZER, "learning_rate": 0.1, "eps": 1e-3}
    )
    per_param = {
        "rw": row_wise(compute_kernel="customized_kernel"),
        "cw": column_wise(ranks=list(range(world_size)), compute_kernel="customized_kernel"),
    }
    mplan = construct_module_sharding_plan(
        module, per_param_sharding=per_param, local_size=world_size, world_size=world_size,
        device_type="cpu", sharder=sharder,
    )  # fmt: skip
    for name in DIMS:
        fields = {f.name: getattr(mplan[name], f.name) for f in dataclasses.fields(mplan[name])}
        mplan[name] = DynamicEmbParameterSharding(
            **fields, dynamicemb_options=_options(name, sources[name])
        )
    return DistributedModelParallel(
        module, env=ShardingEnv.from_process_group(dist.group.WORLD),
        plan=ShardingPlan({"": mplan}), sharders=[sharder], device=torch.device("cpu"),
    )  # fmt: skip


def _planned_source_stays(world_size: int):
    """collective_plan with a source that cannot be pickled (a lambda): each rank's plan
    carries its own source object."""
    source = WarmStart.from_tensor(torch.randn(ROWS, DIMS["rw"]), ids=lambda k: k % ROWS)
    constraints = {
        name: DynamicEmbParameterConstraints(
            use_dynamicemb=True, dynamicemb_options=_options(name, source if name == "rw" else None)
        )
        for name in DIMS
    }  # fmt: skip
    module = EmbeddingBagCollection(tables=_configs(), device=torch.device("meta"))
    planner = DynamicEmbeddingShardingPlanner(
        _configs(), Topology(world_size=world_size, compute_device="cpu"), constraints=constraints
    )
    plan = planner.collective_plan(module, [DynamicEmbeddingBagCollectionSharder()])
    return plan.plan[""]["rw"].dynamicemb_options.warm_start is source


def warm_sharded(rank: int, world_size: int, dump_from: str | None, dump_to: str | None):
    """This rank's outputs of the global batch's first lookup, the keys each source was
    asked, the rw table's entries after it; with ``dump_to``, the rw table is then
    trained a step and dumped there (with its optimizer state) and its entries after
    the step returned too. ``dump_from``: rw warm-starts from that checkpoint."""
    weights = static_weights()
    rw = WarmStart.from_dump(dump_from, "rw") if dump_from else WarmStart.from_tensor(weights["rw"])
    sources = {"rw": CountingSource(rw), "cw": CountingSource(WarmStart.from_tensor(weights["cw"]))}
    model = sharded_model(world_size, sources)
    lengths, keys = global_batch(BATCH * world_size)
    out = model(kjt(lengths, keys, rank * BATCH, (rank + 1) * BATCH)).to_dict()
    values = torch.cat([out[f] for f in FEATURES], dim=1)
    asked = {name: s.keys_asked() for name, s in sources.items()}
    tables = dynamic_tables(model)
    result = {"out": values.detach(), "asked": asked, "rw": entries(tables["rw"])}
    if dump_to is not None:
        values.sum().backward()
        DynamicEmbDump(dump_to, model, table_names=["rw"], optim=True)
        result["trained"] = entries(tables["rw"])
    result["planned"] = _planned_source_stays(world_size)
    return result
