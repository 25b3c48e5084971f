"""Rank-side code of the hot-keys tests: the same sharded model trained with and
without ``hot_replicas`` on the same skewed batches (run on real gloo ranks by
tests/support/multiprocess.py)."""

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
from torchrec.distributed.model_parallel import DistributedModelParallel
from torchrec.distributed.sharding_plan import construct_module_sharding_plan, row_wise
from torchrec.distributed.types import ShardingEnv, ShardingPlan
from torchrec.modules.embedding_configs import PoolingType

from dynemb import (
    DynamicEmbDump,
    DynamicEmbInitializerArgs,
    DynamicEmbLoad,
    DynamicEmbScoreStrategy,
    DynamicEmbTableOptions,
)
from dynemb.deltas import DeltaPublisher, delta_path, read_delta
from dynemb.incremental_dump import incremental_dump
from dynemb.optimizer import optimizer_type_of
from dynemb.planner import DynamicEmbParameterSharding
from dynemb.shard import (
    DynamicEmbeddingBagCollectionSharder,
    DynamicEmbeddingCollectionSharder,
    dynamic_embedding_tables,
    reload_hot_replicas,
)
from dynemb.shard.hot_dist import hot_key_stats, hot_tables
from dynemb.telemetry import table_telemetry
from dynemb.warm_start import WarmStart
from tests.support.ftrl_reference import optimizer_kwargs

FEATURES = ["f0", "f1", "f2"]
STEPS = 20
LR = 0.05
BATCH = 6  # samples per rank
EMPTY_STEP = 5  # a step at which the last rank's batch is empty


@dataclasses.dataclass(frozen=True)
class HotCase:
    optimizer: str = "EXACT_SGD"
    pooling: str = "SUM"  # SUM / MEAN (EBC); NONE for EC
    dist_type: str = "roundrobin"
    weighted: bool = False
    k: int = 4
    refresh: int = 4
    score: str = "TIMESTAMP"
    dedup: bool = False  # EC: use_index_dedup

    def fused_params(self) -> dict:
        return {
            "optimizer": optimizer_type_of(self.optimizer), "learning_rate": LR, "eps": 1e-3,
            **optimizer_kwargs(self.optimizer),
        }  # fmt: skip


def _options(case: HotCase, dim: int, hot: bool, warm_start=None) -> DynamicEmbTableOptions:
    return DynamicEmbTableOptions(
        dim=dim,
        max_capacity=512,
        dist_type=case.dist_type,
        initializer_args=DynamicEmbInitializerArgs(lower=-0.5, upper=0.5),
        seed=3,
        score_strategy=DynamicEmbScoreStrategy[case.score],
        score_half_life_steps=4 if case.score == "DECAYED_LFU" else None,
        hot_replicas=case.k if hot else 0,
        hot_refresh_steps=case.refresh,
        warm_start=warm_start,
    )


def _dims(case: HotCase) -> list[int]:
    return [4, 4] if case.pooling == "NONE" else [4, 8]


def build(case: HotCase, world_size: int, hot: bool, warm: dict | None = None):
    """``warm``: table name -> its warm-start source."""
    d = _dims(case)
    if case.pooling == "NONE":
        configs = [
            EmbeddingConfig(name="t0", embedding_dim=d[0], num_embeddings=100,
                            feature_names=["f0", "f1"]),
            EmbeddingConfig(name="t1", embedding_dim=d[1], num_embeddings=100,
                            feature_names=["f2"]),
        ]  # fmt: skip
        module = EmbeddingCollection(tables=configs, device=torch.device("meta"))
        sharder = DynamicEmbeddingCollectionSharder(
            fused_params=case.fused_params(), use_index_dedup=case.dedup
        )
    else:
        pooling = PoolingType[case.pooling]
        configs = [
            EmbeddingBagConfig(name="t0", embedding_dim=d[0], num_embeddings=100,
                               feature_names=["f0", "f1"], pooling=pooling),
            EmbeddingBagConfig(name="t1", embedding_dim=d[1], num_embeddings=100,
                               feature_names=["f2"], pooling=pooling),
        ]  # fmt: skip
        module = EmbeddingBagCollection(
            tables=configs, is_weighted=case.weighted, device=torch.device("meta")
        )
        sharder = DynamicEmbeddingBagCollectionSharder(fused_params=case.fused_params())
    mplan = construct_module_sharding_plan(
        module,
        per_param_sharding={n: row_wise(compute_kernel="customized_kernel") for n in ("t0", "t1")},
        local_size=world_size,
        world_size=world_size,
        device_type="cpu",
        sharder=sharder,
    )
    for name, dim in zip(("t0", "t1"), d):
        base = mplan[name]
        fields = {f.name: getattr(base, f.name) for f in dataclasses.fields(base)}
        mplan[name] = DynamicEmbParameterSharding(
            **fields, dynamicemb_options=_options(case, dim, hot, (warm or {}).get(name))
        )
    return DistributedModelParallel(
        module,
        env=ShardingEnv.from_process_group(dist.group.WORLD),
        plan=ShardingPlan({"": mplan}),
        sharders=[sharder],
        device=torch.device("cpu"),
    )


def skewed_batch(step: int, world_size: int, weighted: bool):
    """Per feature, per sample keys of the global batch: Zipf-like over 60 keys whose
    ranking turns every 7 steps (so hot sets change: promotions and demotions); at
    EMPTY_STEP the last rank's samples hold no id."""
    g = torch.Generator().manual_seed(500 + step)
    total = BATCH * world_size
    lengths = torch.randint(0, 5, (len(FEATURES), total), generator=g)
    if step == EMPTY_STEP:  # the last rank's batch holds no id
        lengths[:, total - BATCH :] = 0
    n = int(lengths.sum())
    ranks = torch.arange(1, 61, dtype=torch.float64)
    probs = ranks**-1.2
    drawn = torch.multinomial(probs, n, replacement=True, generator=g)
    shift = (step // 7) * 5
    keys = (drawn + shift) % 60 * 3 - 20  # negative keys too
    weights = torch.rand(n, generator=g) if weighted else None
    return lengths, keys, weights


def _local(lengths, keys, weights, rank):
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.flatten().cumsum(0)])
    total = lengths.shape[1]
    a, b = rank * BATCH, (rank + 1) * BATCH
    parts, wparts = [], []
    for f in range(len(FEATURES)):
        lo, hi = int(offsets[f * total + a]), int(offsets[f * total + b])
        parts.append(keys[lo:hi])
        if weights is not None:
            wparts.append(weights[lo:hi])
    return KeyedJaggedTensor(
        keys=FEATURES,
        values=torch.cat(parts),
        lengths=lengths[:, a:b].flatten(),
        weights=torch.cat(wparts) if weights is not None else None,
    )


def _grad(step: int, shape) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(9 + step))


def _train(model, case: HotCase, rank: int, world_size: int):
    outputs = []
    for step in range(STEPS):
        lengths, keys, weights = skewed_batch(step, world_size, case.weighted)
        out = model(_local(lengths, keys, weights, rank))
        if case.pooling == "NONE":
            values = [out[f].values() for f in FEATURES]
            loss = sum((v * _grad(step + 100 * f, v.shape)).sum() for f, v in enumerate(values))
            outputs.append([v.detach().clone() for v in values])
        else:
            values = out.values()
            loss = (values * _grad(step, values.shape)).sum()
            outputs.append(values.detach().clone())
        loss.backward()
    return outputs


def _entries(model) -> dict:
    """Table name -> (keys, whole rows, scores) this rank owns, sorted by key."""
    keys = torch.arange(-40, 200, dtype=torch.int64)
    found = {}
    for group in dynamic_embedding_tables(model).values():
        for name, table in zip(group.table_names, group.tables):
            rows, scores, hit = table.find_entries(keys)
            found[name] = (keys[hit], rows[hit], scores[hit])
    return found


def train_both(rank: int, world_size: int, cases: list[HotCase]):
    """Per case: outputs and owned entries without and with hot replicas, the hot-key
    stats, and each replica's (keys, whole rows) at the end."""
    results = []
    for case in cases:
        plain = build(case, world_size, hot=False)
        plain_out = _train(plain, case, rank, world_size)
        hot = build(case, world_size, hot=True)
        hot_out = _train(hot, case, rank, world_size)
        stats = hot_key_stats(hot)
        replicas = {name: (s.keys.clone(), s.replica_rows()) for name, s in hot_tables(hot).items()}
        chosen = {}
        if case.score in ("LFU", "DECAYED_LFU"):  # the hot sets the scores choose now
            shardings = [h for m in hot.modules() if hasattr(m, "hot_shardings")
                         for h in m.hot_shardings()]  # fmt: skip
            for sharding in shardings:
                sharding.choose(sorted(sharding.tables))
                chosen.update({n: t.keys.clone() for n, t in sharding.tables.items()})
        results.append(
            dict(
                # what the outside sees: every rank's entries, and the tables' names
                plain_dump=incremental_dump(plain, 0, dist.group.WORLD)[0],
                hot_dump=incremental_dump(hot, 0, dist.group.WORLD)[0],
                plain_tables=sorted(table_telemetry(plain)),
                hot_tables=sorted(table_telemetry(hot)),
                plain=plain_out,
                hot=hot_out,
                plain_entries=_entries(plain),
                hot_entries=_entries(hot),
                stats=stats,
                replicas=replicas,
                chosen=chosen,
            )
        )
    return results


def _train_steps(model, case: HotCase, rank: int, world_size: int, steps, seed: int = 0):
    outputs = []
    for step in steps:
        lengths, keys, weights = skewed_batch(step + seed, world_size, case.weighted)
        values = model(_local(lengths, keys, weights, rank)).values()
        (values * _grad(step, values.shape)).sum().backward()
        outputs.append(values.detach().clone())
    return outputs


def checkpoint_round_trip(rank: int, world_size: int, case: HotCase, directory: str):
    """Outputs of steps 10..19 of: the plain model trained throughout; a plain model
    loading the dump of a hot model's first 10 steps; a hot model (trained on other
    batches, hot sets full) loading the plain model's dump, then reloading its replicas
    (``reload`` False: without)."""
    first, last = range(10), range(10, STEPS)
    plain = build(case, world_size, hot=False)
    _train_steps(plain, case, rank, world_size, first)
    DynamicEmbDump(f"{directory}/plain", plain, optim=True)
    reference = _train_steps(plain, case, rank, world_size, last)

    hot = build(case, world_size, hot=True)
    _train_steps(hot, case, rank, world_size, first)
    assert hot_key_stats(hot)["hot_keys"] > 0
    DynamicEmbDump(f"{directory}/hot", hot, optim=True)
    fresh = build(case, world_size, hot=False)
    DynamicEmbLoad(f"{directory}/hot", fresh, optim=True)
    from_hot = _train_steps(fresh, case, rank, world_size, last)

    results = {"reference": reference, "from_hot": from_hot}
    for reload in (True, False):
        other = build(case, world_size, hot=True)
        _train_steps(other, case, rank, world_size, first, seed=1000)  # other rows
        assert hot_key_stats(other)["hot_keys"] > 0
        DynamicEmbLoad(f"{directory}/plain", other, optim=True)
        if reload:
            reload_hot_replicas(other)
        results[f"into_hot_reload_{reload}"] = _train_steps(other, case, rank, world_size, last)
    return results


WARM_ROWS = 50  # rows of the warm-start sources: key k reads row k mod 50


def _published(model, case: HotCase, rank: int, world_size: int, root: str) -> list:
    """Trains ``model`` STEPS steps while publishing (the base after step 2, a delta
    every 5 steps): each delta's tables as name -> (keys, values, state, tombstones),
    sorted by key (rank 0 writes them; every rank reads them back)."""
    publisher = DeltaPublisher(model, root, optim=True, fault_timeout=60)
    for step in range(STEPS):
        _train_steps(model, case, rank, world_size, [step])
        if step == 1:
            publisher.publish_base()
        elif step > 1 and step % 5 == 4:
            publisher.publish()
    publisher.close()
    dist.barrier()
    deltas = []
    for version in range(1, publisher.version + 1):
        tables = {}
        for name, d in read_delta(delta_path(root, version)).tables.items():
            order = torch.argsort(d.keys)
            tables[name] = (d.keys[order], d.values[order], d.state[order], d.tombstones.sort()[0])
        deltas.append(tables)
    return deltas


def deltas_and_warm_start(rank: int, world_size: int, case: HotCase, directory: str) -> dict:
    """The deltas published over the model trained without and with hot replicas, and
    the outputs of both warm-started from the same source (both tables)."""
    result = {}
    for hot in (False, True):
        model = build(case, world_size, hot=hot)
        result[f"deltas_{hot}"] = _published(model, case, rank, world_size, f"{directory}/{hot}")
        result[f"stats_{hot}"] = hot_key_stats(model)
        g = torch.Generator().manual_seed(77)
        warm = {
            name: WarmStart.from_tensor(torch.randn(WARM_ROWS, dim, generator=g), ids="modulo")
            for name, dim in zip(("t0", "t1"), _dims(case))
        }
        model = build(case, world_size, hot=hot, warm=warm)
        result[f"warm_{hot}"] = _train_steps(model, case, rank, world_size, range(STEPS))
        result[f"warm_entries_{hot}"] = _entries(model)
        result[f"warm_stats_{hot}"] = hot_key_stats(model)
    return result
