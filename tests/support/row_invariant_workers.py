"""Rank-side code of test_row_invariants_sharded.py: a row-wise sharded
EmbeddingCollection of two small evicting dynamic tables, trained with EXACT_SGD at
learning rate 1 on batches whose distinct keys overflow every rank's shard, each step
checked against the union of all ranks' stored rows (the invariants of
test_row_invariants.py)."""

import dataclasses

import torch
import torch.distributed as dist
from torchrec import EmbeddingCollection, EmbeddingConfig, KeyedJaggedTensor
from torchrec.distributed.comm_ops import get_gradient_division
from torchrec.distributed.model_parallel import DistributedModelParallel
from torchrec.distributed.sharding_plan import construct_module_sharding_plan, row_wise
from torchrec.distributed.types import ShardingEnv, ShardingPlan

from dynemb import (
    BatchedDynamicEmbeddingTables,
    DynamicEmbCheckMode,
    DynamicEmbInitializerArgs,
    DynamicEmbPoolingMode,
    DynamicEmbTableOptions,
)
from dynemb.optimizer import EmbOptimType
from dynemb.planner import DynamicEmbParameterSharding
from dynemb.shard import DynamicEmbeddingCollectionSharder
from tests.support.sharded_workers import dynamic_tables

DIM = 4
FEATURES = ["f0", "f1", "f2"]
TABLE_OF_FEATURE = {"f0": "t0", "f1": "t0", "f2": "t1"}
SAMPLES_PER_RANK = 160
KEY_SPAN = 3000  # distinct keys of a step: several times a shard's 256 rows


def _options(strategy) -> DynamicEmbTableOptions:
    return DynamicEmbTableOptions(
        dim=DIM, max_capacity=256, bucket_capacity=64, score_strategy=strategy,
        initializer_args=DynamicEmbInitializerArgs(lower=-0.5, upper=0.5),
        safe_check_mode=DynamicEmbCheckMode.IGNORE, seed=3,
    )  # fmt: skip


def _model(world_size: int, strategy, index_dedup: bool):
    configs = [
        EmbeddingConfig(name="t0", embedding_dim=DIM, num_embeddings=64, feature_names=FEATURES[:2]),
        EmbeddingConfig(name="t1", embedding_dim=DIM, num_embeddings=64, feature_names=FEATURES[2:]),
    ]  # fmt: skip
    module = EmbeddingCollection(tables=configs, device=torch.device("meta"))
    sharder = DynamicEmbeddingCollectionSharder(
        fused_params={"optimizer": EmbOptimType.EXACT_SGD, "learning_rate": 1.0},
        use_index_dedup=index_dedup,
    )
    plan = construct_module_sharding_plan(
        module,
        per_param_sharding={c.name: row_wise(compute_kernel="customized_kernel") for c in configs},
        local_size=world_size,
        world_size=world_size,
        device_type="cpu",
        sharder=sharder,
    )
    for name in ("t0", "t1"):
        base = plan[name]
        fields = {f.name: getattr(base, f.name) for f in dataclasses.fields(base)}
        plan[name] = DynamicEmbParameterSharding(**fields, dynamicemb_options=_options(strategy))
    return DistributedModelParallel(
        module,
        env=ShardingEnv.from_process_group(dist.group.WORLD),
        plan=ShardingPlan({"": plan}),
        sharders=[sharder],
        device=torch.device("cpu"),
    )


def _global_batch(step: int, world_size: int):
    """Per feature: lengths of every sample of every rank, and the keys (the same on
    every rank); a third of the lookups on 16 hot keys, so that keys repeat."""
    g = torch.Generator().manual_seed(500 + step)
    lengths = torch.randint(0, 10, (len(FEATURES), world_size * SAMPLES_PER_RANK), generator=g)
    ids = torch.randint(0, KEY_SPAN, (int(lengths.sum()),), generator=g)
    hot = torch.rand(ids.numel(), generator=g) < 1 / 3
    ids[hot] %= 16
    return lengths, ids * 7919 - 5 * KEY_SPAN  # negative keys too


def _local(lengths, keys, rank: int):
    """This rank's KJT and, per feature, its keys; and every feature's global keys."""
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.flatten().cumsum(0)])
    batch = lengths.shape[1]
    start, stop = rank * SAMPLES_PER_RANK, (rank + 1) * SAMPLES_PER_RANK
    local, every = {}, {}
    for f, name in enumerate(FEATURES):
        a, b = int(offsets[f * batch + start]), int(offsets[f * batch + stop])
        local[name] = keys[a:b]
        every[name] = keys[int(offsets[f * batch]) : int(offsets[(f + 1) * batch])]
    kjt = KeyedJaggedTensor(
        keys=FEATURES,
        values=torch.cat(list(local.values())),
        lengths=lengths[:, start:stop].flatten(),
    )
    return kjt, local, every


def _stored_everywhere(model) -> dict[str, dict[int, torch.Tensor]]:
    """Table -> {key: row} over all ranks (each key on one rank)."""
    mine = {}
    for name, table in dynamic_tables(model).items():
        keys, values, _, _ = table.export_batch(0, table.capacity())
        mine[name] = {int(k): v.clone() for k, v in zip(keys, values, strict=True)}
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, mine)
    union = {name: {} for name in mine}
    for part in gathered:
        for name, rows in part.items():
            assert not union[name].keys() & rows.keys(), f"{name}: a key on two ranks"
            union[name].update(rows)
    return union


def _initial_rows(keys: torch.Tensor, strategy) -> torch.Tensor:
    options = _options(strategy)
    options.max_capacity = 1 << 16
    big = BatchedDynamicEmbeddingTables(
        [options], [0], pooling_mode=DynamicEmbPoolingMode.NONE, optimizer=EmbOptimType.EXACT_SGD
    )
    with torch.no_grad():
        return big(keys, torch.arange(keys.numel() + 1))


def train_checked(rank: int, world_size: int, strategy, index_dedup: bool, steps: int) -> int:
    """``steps`` checked steps; returns the number of lookups this rank checked."""
    model = _model(world_size, strategy, index_dedup)
    step_size = 1.0 / world_size if get_gradient_division() else 1.0
    checked = 0
    for step in range(steps):
        lengths, keys = _global_batch(step, world_size)
        kjt, local, every = _local(lengths, keys, rank)
        before = _stored_everywhere(model)
        out = model(kjt)
        sum(out[f].values().sum() for f in FEATURES).backward()
        after = _stored_everywhere(model)
        for f in FEATURES:  # (1) every local lookup read its own row
            table, rows = TABLE_OF_FEATURE[f], out[f].values().detach()
            init = _initial_rows(local[f], strategy)
            for i, k in enumerate(local[f].tolist()):
                if k in before[table]:
                    assert torch.equal(rows[i], before[table][k]), f"{table} {k}: not its row"
                elif k in after[table]:
                    assert torch.equal(rows[i], init[i]), f"{table} {k}: not its initial row"
                else:
                    assert not rows[i].any(), f"{table} {k} (not stored): not the eval row"
                checked += 1
        for table in ("t0", "t1"):  # (2) and (3) over every rank's lookups
            counts = {}
            for f in FEATURES:
                if TABLE_OF_FEATURE[f] == table:
                    for k in every[f].tolist():
                        counts[k] = counts.get(k, 0) + 1
            old, new = before[table], after[table]
            looked_up = torch.tensor(sorted(counts.keys() & new.keys()), dtype=torch.int64)
            init = dict(zip(looked_up.tolist(), _initial_rows(looked_up, strategy), strict=True))
            for k, row in new.items():
                if k in counts:
                    start = old.get(k, init.get(k))
                    assert torch.equal(row, start - counts[k] * step_size), (
                        f"{table} {k}: moved by another key's gradient"
                    )
                else:
                    assert k in old and torch.equal(row, old[k]), f"{table} {k}: changed"
            left, arrived = old.keys() - new.keys(), new.keys() - old.keys()
            assert len(left) <= len(arrived), f"{table}: {len(left)} left, {len(arrived)} came"
            assert len(counts) > 256 * world_size, "the batch did not overflow the shards"
    return checked
