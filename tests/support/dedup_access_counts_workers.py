"""Rank-side code of tests/shard/test_dedup_access_counts.py: a sharded EC whose dynamic tables
count accesses (LFU scores, an admission counter), trained with and without
``use_index_dedup``, and what each rank's tables hold afterwards."""

import dataclasses

import torch
import torch.distributed as dist
from torchrec import EmbeddingCollection, EmbeddingConfig, KeyedJaggedTensor
from torchrec.distributed.model_parallel import DistributedModelParallel
from torchrec.distributed.sharding_plan import construct_module_sharding_plan, row_wise, table_wise
from torchrec.distributed.types import ShardingEnv, ShardingPlan

from dynemb import (
    BatchedDynamicEmbeddingTables,
    DynamicEmbPoolingMode,
    DynamicEmbScoreStrategy,
)
from dynemb.admission_strategies import FrequencyAdmissionStrategy, KVCounter
from dynemb.optimizer import EmbOptimType
from dynemb.planner import DynamicEmbParameterSharding
from dynemb.shard import DynamicEmbeddingCollectionSharder, dynamic_embedding_tables
from dynemb.tiering import CachedTable
from tests.support.sharded_workers import (
    FEATURE_TABLE,
    FEATURES,
    NUM_EMBEDDINGS,
    global_batch,
    local_kjt,
    table_options,
)

DIM = 4
STEPS = 6
THRESHOLD = 3  # t1 admits a key once it has been seen 3 times
FUSED = {"optimizer": EmbOptimType.EXACT_ROWWISE_ADAGRAD, "learning_rate": 0.05, "eps": 1e-3}
# Table -> (features, sharding): "dynamic" (row-wise, ours), "rw" / "tw" ordinary
# TorchRec tables (row-wise in the dynamic tables' sharding / table-wise).
DYNAMIC = {"t0": (["f0", "f1"], "dynamic"), "t1": (["f2"], "dynamic")}
MIXED = {"t0": (["f0"], "dynamic"), "o_rw": (["f1"], "rw"), "o_tw": (["f2"], "tw")}


def _options(name: str, dist_type: str, capacity: int):
    """t0: LFU; t1: LFU with admission (its counter counts the keys not stored yet)."""
    options = table_options(DIM, dist_type, capacity)
    options.score_strategy = DynamicEmbScoreStrategy.LFU
    if name == "t1":
        options.admit_strategy = FrequencyAdmissionStrategy(THRESHOLD)
        options.admission_counter = KVCounter(capacity=256, bucket_capacity=16)
    return options


def _plan(module, sharder, world_size: int, dist_type: str, tables: dict) -> ShardingPlan:
    sharding = {
        "dynamic": lambda: row_wise(compute_kernel="customized_kernel"),
        "rw": lambda: row_wise(compute_kernel="fused"),
        "tw": lambda: table_wise(rank=world_size - 1, compute_kernel="fused"),
    }
    per_param = {name: sharding[kind]() for name, (_, kind) in tables.items()}
    names = [name for name, (_, kind) in tables.items() if kind == "dynamic"]
    mplan = construct_module_sharding_plan(
        module, per_param_sharding=per_param, local_size=world_size, world_size=world_size,
        device_type="cpu", sharder=sharder,
    )  # fmt: skip
    for name in names:
        base = mplan[name]
        fields = {f.name: getattr(base, f.name) for f in dataclasses.fields(base)}
        mplan[name] = DynamicEmbParameterSharding(
            **fields, dynamicemb_options=_options(name, dist_type, 256)
        )
    return ShardingPlan({"": mplan})


def _model(tables: dict, world_size: int, index_dedup: bool, dist_type: str):
    """The sharded EC of ``tables`` (DYNAMIC: t0 serves f0 and f1, so a key also
    repeats across features; t1 serves f2)."""
    configs = [
        EmbeddingConfig(name=name, embedding_dim=DIM, num_embeddings=NUM_EMBEDDINGS,
                        feature_names=features, init_fn=_init)
        for name, (features, _) in tables.items()
    ]  # fmt: skip
    module = EmbeddingCollection(tables=configs, device=torch.device("meta"))
    sharder = DynamicEmbeddingCollectionSharder(fused_params=FUSED, use_index_dedup=index_dedup)
    return DistributedModelParallel(
        module,
        env=ShardingEnv.from_process_group(dist.group.WORLD),
        plan=_plan(module, sharder, world_size, dist_type, tables),
        sharders=[sharder],
        device=torch.device("cpu"),
    )


def _init(weight: torch.Tensor) -> torch.Tensor:
    # Deterministic per shard shape: ordinary tables start alike in every model.
    with torch.no_grad():
        return weight.copy_(torch.rand(weight.shape, generator=torch.Generator().manual_seed(5)))


def _train_step(model, kjt: KeyedJaggedTensor) -> dict:
    out = model(kjt)
    loss = sum(out[f].values().sum() for f in kjt.keys())
    loss.backward()
    return {f: out[f].values().detach().clone() for f in kjt.keys()}


def tables_state(module: BatchedDynamicEmbeddingTables) -> dict:
    """Per table of ``module``: its (key, score) pairs, and for a table with admission
    its counter's (key, count) pairs (``"<name> counter"``), as sorted lists."""
    state = {}
    for t, (name, table) in enumerate(zip(module.table_names, module.tables, strict=True)):
        if isinstance(table, CachedTable):  # both tiers, synced
            table = table.persistent_table()
        keys, _, scores, _ = table.export_batch(0, table.capacity())
        state[name] = sorted(zip(keys.tolist(), scores.tolist()))
        counter = module.admission_counters[t]
        if counter is not None:
            state[f"{name} counter"] = sorted(zip(*[c.tolist() for c in counter.dump()]))
    return state


def _tables_state(model) -> dict:
    """``tables_state`` of every group of dynamic tables of this rank."""
    state = {}
    for module in dynamic_embedding_tables(model).values():
        state.update(tables_state(module))
    return state


def repeated_id_scores(rank: int, world_size: int) -> dict:
    """Every rank's f0 bag is [5, 5, 5] (f1, f2 empty); per ``use_index_dedup``, the LFU
    score of key 5 in this rank's t0 (0 where another rank owns it)."""
    kjt = KeyedJaggedTensor(
        keys=FEATURES, values=torch.tensor([5, 5, 5]), lengths=torch.tensor([3, 0, 0])
    )
    scores = {}
    for index_dedup in (False, True):
        model = _model(DYNAMIC, world_size, index_dedup, "roundrobin")
        _train_step(model, kjt)
        scores[index_dedup] = dict(_tables_state(model)["t0"]).get(5, 0)
    return scores


def tables_after_training(rank: int, world_size: int, batch_sizes, dist_type: str) -> dict:
    """Per ``use_index_dedup``: this rank's ``_tables_state`` after STEPS training steps
    on its share of the global batches, and its outputs of every step."""
    start, stop = sum(batch_sizes[:rank]), sum(batch_sizes[: rank + 1])
    results = {}
    for index_dedup in (False, True):
        model = _model(DYNAMIC, world_size, index_dedup, dist_type)
        outputs = []
        for step in range(STEPS):
            lengths, keys, _ = global_batch(step, sum(batch_sizes), weighted=False)
            outputs.append(_train_step(model, local_kjt(lengths, keys, None, start, stop)))
        results[index_dedup] = (_tables_state(model), outputs)
    return results


def reference_tables(batch_sizes, dist_type: str) -> dict:
    """``_tables_state`` of one unsharded BatchedDynamicEmbeddingTables trained on the
    global batches (the oracle: every rank's tables together must hold the same)."""
    module = BatchedDynamicEmbeddingTables(
        [_options("t0", dist_type, 4096), _options("t1", dist_type, 4096)],
        FEATURE_TABLE,
        pooling_mode=DynamicEmbPoolingMode.NONE,
        optimizer=FUSED["optimizer"],
        table_names=["t0", "t1"],
    )
    for step in range(STEPS):
        lengths, keys, _ = global_batch(step, sum(batch_sizes), weighted=False)
        offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.flatten().cumsum(0)])
        module(keys, offsets).sum().backward()
    return tables_state(module)


def ordinary_tables_outputs(rank: int, world_size: int) -> dict:
    """A model with dynamic t0 beside ordinary o_rw (row-wise, in the dynamic tables'
    sharding) and o_tw (table-wise): per ``use_index_dedup``, this rank's outputs of
    the ordinary tables' features at every step and their rows afterwards."""
    results = {}
    for index_dedup in (False, True):
        model = _model(MIXED, world_size, index_dedup, "hash_roundrobin")
        outputs = []
        for step in range(STEPS):
            lengths, keys, _ = global_batch(step, 2 * world_size, weighted=False)
            keys = keys.remainder(NUM_EMBEDDINGS)  # ordinary tables take ids in range
            outs = _train_step(model, local_kjt(lengths, keys, None, 2 * rank, 2 * rank + 2))
            outputs.append({f: v for f, v in outs.items() if f != "f0"})
        state = model.state_dict()
        rows = {
            name: [s.tensor.clone() for s in state[f"embeddings.{name}.weight"].local_shards()]
            for name, (_, kind) in MIXED.items()
            if kind != "dynamic"
        }
        results[index_dedup] = (outputs, rows)
    return results
