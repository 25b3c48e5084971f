"""Rank-side code of the sharded-training tests: models, batches, and the single-process
reference they are compared with (run by tests/support/multiprocess.py on real gloo ranks)."""

import dataclasses

import torch
import torch.distributed as dist
from torchrec import (
    EmbeddingBagCollection,
    EmbeddingBagConfig,
    EmbeddingCollection,
    EmbeddingConfig,
    KeyedJaggedTensor,
)
from torchrec.distributed.comm_ops import get_gradient_division
from torchrec.distributed.model_parallel import DistributedModelParallel
from torchrec.distributed.planner import Topology
from torchrec.distributed.sharding_plan import (
    construct_module_sharding_plan,
    row_wise,
    table_wise,
)
from torchrec.distributed.types import ShardingEnv, ShardingPlan
from torchrec.modules.embedding_configs import PoolingType

from dynemb import (
    BatchedDynamicEmbeddingTables,
    DynamicEmbInitializerArgs,
    DynamicEmbPoolingMode,
    DynamicEmbTableOptions,
)
from dynemb.optimizer import OptimizerConfig, optimizer_type_of
from dynemb.planner import (
    DynamicEmbeddingShardingPlanner,
    DynamicEmbParameterConstraints,
    DynamicEmbParameterSharding,
)
from dynemb.shard import (
    DynamicEmbeddingBagCollectionSharder,
    DynamicEmbeddingCollectionSharder,
    dynamic_embedding_tables,
)
from dynemb.tiering import (
    CachedTable,
    PrefetchPipeline,
    distribute_for_prefetch,
    prefetch_distributed,
)
from tests.support.ftrl_reference import optimizer_kwargs

NUM_EMBEDDINGS = 40  # nominal: keys go far beyond it, and below 0
FEATURES = ["f0", "f1", "f2"]
FEATURE_TABLE = [0, 0, 1]  # two features share table t0
STEPS = 10
LR = 0.05


@dataclasses.dataclass(frozen=True)
class Case:
    optimizer: str
    dist_type: str
    pooling: str = "SUM"  # SUM / MEAN (EBC); NONE for EC
    weighted: bool = False
    index_dedup: bool = False  # EC only
    planner: bool = False  # plan with DynamicEmbeddingShardingPlanner instead of by hand
    cache_rows: int = 0  # > 0: caching mode, a cache of this many rows per rank
    prefetch: bool = False  # caching: train through dynemb.tiering.PrefetchPipeline
    table_wise: bool = False  # t1 sharded table-wise, whole on the last rank

    def fused_params(self) -> dict:
        return {
            "optimizer": optimizer_type_of(self.optimizer), "learning_rate": LR, "eps": 1e-3,
            **optimizer_kwargs(self.optimizer),
        }  # fmt: skip


def table_options(
    dim: int, dist_type: str, capacity: int, case: Case | None = None
) -> DynamicEmbTableOptions:
    init = DynamicEmbInitializerArgs(
        lower=-0.5, upper=0.5
    )  # bounds fixed: rows depend on keys only
    options = DynamicEmbTableOptions(
        dim=dim, max_capacity=capacity, dist_type=dist_type, initializer_args=init, seed=3
    )
    if case is not None and case.cache_rows:
        state = OptimizerConfig(optimizer_type_of(case.optimizer)).state_columns(dim)
        options.caching = True
        options.local_hbm_for_values = case.cache_rows * (dim + state) * 4
    return options


def dims(case: Case) -> list[int]:
    return [4, 4] if case.pooling == "NONE" else [4, 8]


def global_batch(step: int, batch_size: int, weighted: bool):
    """Per feature, per sample lists of keys (and weights): the same on every rank."""
    g = torch.Generator().manual_seed(1000 + step)
    pool = torch.tensor(
        [0, 1, 2, 3, 5, 8, 13, 39, 40, 41, 1 << 40, -1, -7, -(1 << 62), (1 << 63) - 1]
    )
    lengths = torch.randint(0, 4, (len(FEATURES), batch_size), generator=g)
    keys = pool[torch.randint(0, len(pool), (int(lengths.sum()),), generator=g)]
    weights = torch.rand(keys.numel(), generator=g) if weighted else None
    return lengths, keys, weights


def local_kjt(lengths, keys, weights, start: int, stop: int) -> KeyedJaggedTensor:
    """Samples [start, stop) of a feature-major global batch, as a KJT."""
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.flatten().cumsum(0)])
    f_count, batch = lengths.shape
    parts, wparts = [], []
    for f in range(f_count):
        a, b = int(offsets[f * batch + start]), int(offsets[f * batch + stop])
        parts.append(keys[a:b])
        if weights is not None:
            wparts.append(weights[a:b])
    return KeyedJaggedTensor(
        keys=FEATURES,
        values=torch.cat(parts) if parts else keys[:0],
        lengths=lengths[:, start:stop].flatten(),
        weights=torch.cat(wparts) if weights is not None else None,
    )


def out_grad(step: int, rows: int, width: int) -> torch.Tensor:
    return torch.randn(rows, width, generator=torch.Generator().manual_seed(7 + step))


def _plan(module, sharder, case: Case, world_size: int, dims_: list[int]) -> ShardingPlan:
    names = ["t0", "t1"]
    per_param = {n: row_wise(compute_kernel="customized_kernel") for n in names}
    if case.table_wise:
        per_param["t1"] = table_wise(rank=world_size - 1, compute_kernel="customized_kernel")
    mplan = construct_module_sharding_plan(
        module,
        per_param_sharding=per_param,
        local_size=world_size,
        world_size=world_size,
        device_type="cpu",
        sharder=sharder,
    )
    for name, dim in zip(names, dims_):
        base = mplan[name]
        fields = {f.name: getattr(base, f.name) for f in dataclasses.fields(base)}
        mplan[name] = DynamicEmbParameterSharding(
            **fields, dynamicemb_options=table_options(dim, case.dist_type, 256, case)
        )
    return ShardingPlan({"": mplan})


def _planned(module, configs, sharder, case: Case, world_size: int, dims_: list[int], pg):
    constraints = {
        c.name: DynamicEmbParameterConstraints(
            use_dynamicemb=True, dynamicemb_options=table_options(dim, case.dist_type, None)
        )
        for c, dim in zip(configs, dims_)
    }
    planner = DynamicEmbeddingShardingPlanner(
        configs, Topology(world_size=world_size, compute_device="cpu"), constraints=constraints
    )
    plan = planner.collective_plan(module, [sharder], pg)
    for c in configs:  # the planner's per-rank options reach the tables
        assert plan.plan[""][c.name].dynamicemb_options.max_capacity is not None
    return plan


def build_model(case: Case, world_size: int, pg: dist.ProcessGroup | None = None):
    """The sharded model of ``case`` over ``pg`` (default: the world) of ``world_size`` ranks."""
    pg = pg if pg is not None else dist.group.WORLD
    d = dims(case)
    if case.pooling == "NONE":
        configs = [
            EmbeddingConfig(name="t0", embedding_dim=d[0], num_embeddings=NUM_EMBEDDINGS,
                            feature_names=["f0", "f1"]),
            EmbeddingConfig(name="t1", embedding_dim=d[1], num_embeddings=NUM_EMBEDDINGS,
                            feature_names=["f2"]),
        ]  # fmt: skip
        module = EmbeddingCollection(tables=configs, device=torch.device("meta"))
        sharder = DynamicEmbeddingCollectionSharder(
            fused_params=case.fused_params(), use_index_dedup=case.index_dedup
        )
    else:
        pooling = PoolingType[case.pooling]
        configs = [
            EmbeddingBagConfig(name="t0", embedding_dim=d[0], num_embeddings=NUM_EMBEDDINGS,
                               feature_names=["f0", "f1"], pooling=pooling),
            EmbeddingBagConfig(name="t1", embedding_dim=d[1], num_embeddings=NUM_EMBEDDINGS,
                               feature_names=["f2"], pooling=pooling),
        ]  # fmt: skip
        module = EmbeddingBagCollection(
            tables=configs, is_weighted=case.weighted, device=torch.device("meta")
        )
        sharder = DynamicEmbeddingBagCollectionSharder(fused_params=case.fused_params())
    if case.planner:
        plan = _planned(module, configs, sharder, case, world_size, d, pg)
    else:
        plan = _plan(module, sharder, case, world_size, d)
    return DistributedModelParallel(
        module,
        env=_sharding_env(pg),
        plan=plan,
        sharders=[sharder],
        device=torch.device("cpu"),
    )


def _sharding_env(pg: dist.ProcessGroup) -> ShardingEnv:
    """TorchRec's env over ``pg``. Over a group smaller than the world, without the
    device mesh ``from_process_group`` builds: that is a collective of the whole world
    (the other ranks are not there), and only DTensor outputs use it."""
    if pg is dist.group.WORLD:
        return ShardingEnv.from_process_group(pg)
    env = ShardingEnv(dist.get_world_size(pg), dist.get_rank(pg), pg=None)
    env.process_group = pg
    return env


def dynamic_tables(model) -> dict:
    """Table name -> ScoredHashTable of this rank."""
    found = {}
    for module in dynamic_embedding_tables(model).values():
        found.update(zip(module.table_names, module.tables))
    return found


def train_sharded(rank: int, world_size: int, cases: list[Case], batch_sizes: list[int]):
    """Per case: each step's local outputs, then the rows each rank holds for every key."""
    start = sum(batch_sizes[:rank])
    stop = start + batch_sizes[rank]
    total = sum(batch_sizes)
    results = []
    for case in cases:
        model = build_model(case, world_size)
        outputs, all_keys = [], []

        def train_step(item, case=case, model=model, outputs=outputs, all_keys=all_keys):
            step, kjt = item
            lengths, keys, weights = global_batch(step, total, case.weighted)
            all_keys.append(keys)
            out = model(kjt)
            if case.pooling == "NONE":
                per_feature = [out[f].values() for f in FEATURES]
                loss = sum(
                    (v * _sequence_grad(step, lengths, f, start, stop, v.shape[1])).sum()
                    for f, v in enumerate(per_feature)
                )
                outputs.append([v.detach().clone() for v in per_feature])
            else:
                values = out.values()
                loss = (values * out_grad(step, total, values.shape[1])[start:stop]).sum()
                outputs.append(values.detach().clone())
            loss.backward()

        batches = []
        for step in range(STEPS):
            lengths, keys, weights = global_batch(step, total, case.weighted)
            batches.append((step, local_kjt(lengths, keys, weights, start, stop)))
        if case.prefetch:  # batch t + 1 prefetched (input dist here, fill in the background)
            PrefetchPipeline(
                batches,
                train_step,
                prefetch_distributed,
                distribute=lambda b, model=model: [distribute_for_prefetch(model.module, b[1])],
                overlap=True,  # the background fill is what this case exercises
            ).run()
        else:
            for item in batches:
                train_step(item)
        keys = torch.unique(torch.cat(all_keys))
        tables = dynamic_tables(model)
        if case.cache_rows:  # caching mode really ran, and prefetch reached the caches
            assert all(isinstance(t, CachedTable) for t in tables.values())
            prefetched = sum(t.stats.prefetch_keys for t in tables.values())
            assert (prefetched > 0) == case.prefetch
            assert sum(t.stats.lookup_hits for t in tables.values()) > 0
        rows = {name: table.find(keys) for name, table in tables.items()}
        results.append((outputs, keys, rows))
    return results


def _sequence_grad(step, lengths, f, start, stop, dim):
    """Rows of the global per-feature output gradient that belong to samples [start, stop)."""
    per_feature = lengths.sum(1)
    grad = out_grad(step, int(per_feature[f]), dim)
    begin = int(lengths[f, :start].sum())
    return grad[begin : begin + int(lengths[f, start:stop].sum())]


def train_reference(case: Case, batch_sizes: list[int], world_size: int):
    """The unsharded run: one BatchedDynamicEmbeddingTables on the global batch."""
    total = sum(batch_sizes)
    d = dims(case)
    pooling = DynamicEmbPoolingMode[case.pooling]
    tables = BatchedDynamicEmbeddingTables(
        [table_options(d[0], case.dist_type, 4096), table_options(d[1], case.dist_type, 4096)],
        FEATURE_TABLE,
        pooling_mode=pooling,
        optimizer=optimizer_type_of(case.optimizer),
        learning_rate=LR,
        eps=1e-3,
        table_names=["t0", "t1"],
        **optimizer_kwargs(case.optimizer),
    )
    # TorchRec divides the embedding gradient by the world size in its collectives.
    scale = 1.0 / world_size if get_gradient_division() else 1.0
    outputs = []
    for step in range(STEPS):
        lengths, keys, weights = global_batch(step, total, case.weighted)
        offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.flatten().cumsum(0)])
        out = tables(keys, offsets, weights)
        if case.pooling == "NONE":
            per_feature = lengths.sum(1).tolist()
            grads = [out_grad(step, n, d[0]) for n in per_feature]
            loss = (out * torch.cat(grads)).sum() * scale
        else:
            loss = (out * out_grad(step, total, out.shape[1])).sum() * scale
        outputs.append(out.detach().clone())
        loss.backward()
    return tables, outputs
