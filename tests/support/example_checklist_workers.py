"""Rank-side code of test_example_checklist.py: DYNAMICEMB_API.md §12, the calls of
DynamicEmb's example.py in order, with only the import renamed and CUDA replaced by CPU."""

import torch
import torch.distributed as dist
from fbgemm_gpu.split_embedding_configs import SparseType
from torchrec import EmbeddingCollection, EmbeddingConfig, KeyedJaggedTensor
from torchrec.distributed.model_parallel import DistributedModelParallel
from torchrec.distributed.planner import Topology
from torchrec.distributed.planner.storage_reservations import HeuristicalStorageReservation

from dynemb import (
    DynamicEmbDump,
    DynamicEmbInitializerArgs,
    DynamicEmbInitializerMode,
    DynamicEmbLoad,
    DynamicEmbScoreStrategy,
    DynamicEmbTableOptions,
    FrequencyAdmissionStrategy,
    KVCounter,
    get_sharded_table_capacity,
    get_table_value_bytes,
)
from dynemb.incremental_dump import get_score, incremental_dump
from dynemb.optimizer import EmbOptimType
from dynemb.planner import (
    DynamicEmbeddingEnumerator,
    DynamicEmbeddingShardingPlanner,
    DynamicEmbParameterConstraints,
)
from dynemb.shard import DynamicEmbeddingCollectionSharder, dynamic_embedding_tables

ROWS = [2, 10, 100, 1000, 5000, 10000]
DIM = 8
BATCH = 8  # per rank


def _model(world_size: int):
    configs = [
        EmbeddingConfig(name=f"t{i}", embedding_dim=DIM, num_embeddings=n, feature_names=[f"f{i}"])
        for i, n in enumerate(ROWS)
    ]
    module = EmbeddingCollection(tables=configs, device=torch.device("meta"))
    fused = {"output_dtype": SparseType.FP32, "optimizer": EmbOptimType.ADAM,
             "learning_rate": 0.01, "beta1": 0.9, "beta2": 0.999, "weight_decay": 0,
             "eps": 0.001, "prefetch_pipeline": False}  # fmt: skip
    sharder = DynamicEmbeddingCollectionSharder(
        qcomm_codecs_registry={}, fused_params=fused, use_index_dedup=True
    )
    constraints = {}
    for i, cfg in enumerate(configs):
        caching = i in (3, 5)  # dynemb: caching and admission do not combine (yet)
        value_bytes = get_table_value_bytes(cfg, EmbOptimType.ADAM, world_size, 128)
        admit = counter = None
        if cfg.num_embeddings <= 10:  # admission with tiny tables (capacity < 1024)
            counter = KVCounter(
                capacity=get_sharded_table_capacity(cfg, world_size, 128),
                bucket_capacity=1024,
                key_type=torch.int64,
            )
            admit = FrequencyAdmissionStrategy(
                threshold=2,
                initializer_args=DynamicEmbInitializerArgs(
                    mode=DynamicEmbInitializerMode.CONSTANT, value=0.0
                ),
            )
        constraints[cfg.name] = DynamicEmbParameterConstraints(
            sharding_types=["row_wise"],
            use_dynamicemb=True,
            dynamicemb_options=DynamicEmbTableOptions(
                global_hbm_for_values=int(value_bytes * (0.5 if caching else 1)),
                initializer_args=DynamicEmbInitializerArgs(mode=DynamicEmbInitializerMode.NORMAL),
                dist_type="roundrobin",
                score_strategy=DynamicEmbScoreStrategy.STEP,
                caching=caching,
                training=True,
                bucket_capacity=128,
                admit_strategy=admit,
                admission_counter=counter,
            ),
        )
    topology = Topology(world_size=world_size, compute_device="cpu")
    enumerator = DynamicEmbeddingEnumerator(topology=topology, constraints=constraints)
    planner = DynamicEmbeddingShardingPlanner(
        eb_configs=configs, topology=topology, constraints=constraints, batch_size=BATCH,
        enumerator=enumerator,
        storage_reservation=HeuristicalStorageReservation(percentage=0.05), debug=True,
    )  # fmt: skip
    plan = planner.collective_plan(module, [sharder], dist.GroupMember.WORLD)
    return DistributedModelParallel(
        module=module, device=torch.device("cpu"), sharders=[sharder], plan=plan
    )


def _batch(step: int, rank: int) -> KeyedJaggedTensor:
    g = torch.Generator().manual_seed(10 * step + rank)
    lengths = torch.randint(1, 3, (len(ROWS), BATCH), generator=g)
    keys = [torch.randint(0, n, (int(lengths[i].sum()),), generator=g) for i, n in enumerate(ROWS)]
    return KeyedJaggedTensor(
        keys=[f"f{i}" for i in range(len(ROWS))],
        values=torch.cat(keys),
        lengths=lengths.flatten(),
    )


def _train(model, rank: int, steps: range) -> None:
    for step in steps:
        out = model(_batch(step, rank))
        sum(jt.values().sum() for jt in out.values()).backward()


def _contents(model) -> dict:
    """Table -> (keys, rows) this rank stores, among the keys the batches can hold."""
    out = {}
    for module in dynamic_embedding_tables(model).values():
        for name, table in zip(module.table_names, module.tables):
            keys = torch.arange(ROWS[int(name[1:])])
            rows, found = table.find(keys)
            out[name] = (keys[found], rows[found])
    return out


def run_checklist(rank: int, world_size: int, path: str) -> dict:
    model = _model(world_size)
    _train(model, rank, range(6))
    torch.save(model.state_dict(), f"{path}/state_dict.rank{rank}.pt")
    DynamicEmbDump(f"{path}/ckpt", model, optim=True)
    saved = _contents(model)

    restored = _model(world_size)
    restored.load_state_dict(torch.load(f"{path}/state_dict.rank{rank}.pt"), strict=False)
    DynamicEmbLoad(f"{path}/ckpt", restored, optim=True)
    loaded = _contents(restored)
    scores = get_score(restored)
    _train(restored, rank, range(6, 9))
    ret, new_scores = incremental_dump(restored, scores)
    return {
        "scores": scores,
        "new_scores": new_scores,
        "dumped": {p: {t: (k, v) for t, (k, v) in tables.items()} for p, tables in ret.items()},
        "saved": saved,
        "loaded": loaded,
    }
