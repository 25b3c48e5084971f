"""Rank-side code of tests/deltas/test_delta_sharded.py: a DMP EmbeddingCollection row-wise
sharded over the ranks, with tables far smaller than the id space (they evict),
trained while a DeltaPublisher publishes a base and deltas; an erase; a write of
rank 0 that fails (both ranks must raise, and lose no change)."""

import torch
from torchrec import EmbeddingCollection, EmbeddingConfig, KeyedJaggedTensor
from torchrec.distributed.sharding_plan import construct_module_sharding_plan, row_wise

from dynemb import DynamicEmbInitializerArgs, DynamicEmbTableOptions
from dynemb.deltas import DeltaPublisher, delta_path
from dynemb.optimizer import EmbOptimType
from dynemb.shard import DynamicEmbeddingCollectionSharder
from dynemb.table.change_log import ChangeLog
from tests.support.plan_entries import dynamic_entry, sharded_model
from tests.support.sharded_workers import dynamic_tables

DIM = 4
FEATURES = ["f0", "f1", "f2"]
FEATURE_TABLE = [0, 0, 1]  # t0 <- f0, f1; t1 <- f2
CAPACITY = 32  # per rank: the ids (-100..99) do not fit
BATCH = 6  # samples per rank
STEPS = 12  # the last step publishes: the deltas hold every change
BASE_STEP, EVERY, ERASE_STEP, FAIL_STEP = 2, 3, 7, 9
EVAL_VALUE = (0.5, 1.5)  # each table's eval initializer: evicted keys read it back


def table_options(t: int, dist_type: str, capacity: int = CAPACITY) -> DynamicEmbTableOptions:
    options = DynamicEmbTableOptions(
        dim=DIM,
        max_capacity=capacity,
        bucket_capacity=16,
        dist_type=dist_type,
        initializer_args=DynamicEmbInitializerArgs(lower=-0.5, upper=0.5),
        seed=3 + t,
    )
    options.eval_initializer_args.value = EVAL_VALUE[t]
    return options


def _model(world_size: int, dist_type: str):
    configs = [
        EmbeddingConfig(name="t0", embedding_dim=DIM, num_embeddings=200, feature_names=["f0", "f1"]),
        EmbeddingConfig(name="t1", embedding_dim=DIM, num_embeddings=200, feature_names=["f2"]),
    ]  # fmt: skip
    module = EmbeddingCollection(tables=configs, device=torch.device("meta"))
    sharder = DynamicEmbeddingCollectionSharder(
        fused_params={"optimizer": EmbOptimType.ADAM, "learning_rate": 0.1, "eps": 1e-3}
    )
    plan = construct_module_sharding_plan(
        module,
        per_param_sharding={c.name: row_wise(compute_kernel="customized_kernel") for c in configs},
        local_size=world_size,
        world_size=world_size,
        device_type="cpu",
        sharder=sharder,
    )
    for t, c in enumerate(configs):
        plan[c.name] = dynamic_entry(plan[c.name], table_options(t, dist_type))
    return sharded_model(module, plan, sharder)


def global_keys(step: int, world_size: int) -> torch.Tensor:
    """(features, world_size * BATCH) single keys from -100..99: the same on every rank."""
    g = torch.Generator().manual_seed(500 + step)
    return torch.randint(-100, 100, (len(FEATURES), world_size * BATCH), generator=g)


def kjt_of(keys: torch.Tensor) -> KeyedJaggedTensor:
    """(features, samples) keys, one per bag."""
    return KeyedJaggedTensor(
        keys=FEATURES, values=keys.flatten(), lengths=torch.ones(keys.numel(), dtype=torch.int64)
    )


def train_and_publish(rank: int, world_size: int, root: str, dist_type: str) -> dict:
    """Trains and publishes (base at BASE_STEP, a delta every EVERY steps after; the
    delta of FAIL_STEP fails on rank 0 first); returns the eval rows of every key seen."""
    model = _model(world_size, dist_type)
    tables = dynamic_tables(model)
    refused_on_every_rank = _refused_when_one_rank_cannot(model, tables, rank, root)
    publisher = DeltaPublisher(model, root, fault_timeout=20)
    failures = []
    for step in range(1, STEPS + 1):
        keys = global_keys(step, world_size)[:, rank * BATCH : (rank + 1) * BATCH]
        out = model(kjt_of(keys))
        grad = torch.randn(keys.numel(), DIM, generator=torch.Generator().manual_seed(step))
        torch.cat([out[f].values() for f in FEATURES]).mul(grad).sum().backward()
        if step == BASE_STEP:
            assert publisher.publish_base() == 0
        if step == ERASE_STEP:  # every rank erases what it holds of these keys
            erased = tables["t1"].erase(global_keys(step, world_size)[2])
            assert erased > 0
        if step > BASE_STEP and step % EVERY == 0:
            if step == FAIL_STEP:
                failures.append(_failed_publish(publisher, rank, root))
            assert publisher.publish() == publisher.version
    refusal = None
    try:
        publisher.publish(background=True)
    except ValueError as e:
        refusal = str(e)
    publisher.close()

    seen = torch.unique(
        torch.cat([global_keys(s, world_size).flatten() for s in range(1, STEPS + 1)])
    )
    model.eval()
    with torch.no_grad():
        out = model(kjt_of(seen.expand(len(FEATURES), -1)))
    rows = {f: out[f].values() for f in FEATURES}
    stored = {name: table.contains(seen) for name, table in tables.items()}
    return dict(
        version=publisher.version,
        seen=seen,
        rows=rows,
        stored=stored,
        sizes={name: table.size() for name, table in tables.items()},
        failures=failures,
        refusal=refusal,
        refused_on_every_rank=refused_on_every_rank,
    )


def _refused_when_one_rank_cannot(model, tables: dict, rank: int, root: str) -> str | None:
    """Rank 1's table t0 is tracked already: creating a publisher raises on every rank
    (no rank waits for the others in a collective); nothing is left tracked."""
    if rank == 1:
        tables["t0"].change_log = ChangeLog()
    try:
        DeltaPublisher(model, root, fault_timeout=20)
    except ValueError as e:
        error = str(e)
    else:
        error = None
    if rank == 1:
        tables["t0"].change_log = None
    assert all(t.change_log is None for t in tables.values())
    return error


def _failed_publish(publisher: DeltaPublisher, rank: int, root: str) -> tuple:
    """Rank 0's write of the next version fails (its directory exists): every rank
    raises, the version does not move; rank 0 then removes the obstacle."""
    version = publisher.version
    obstacle = delta_path(root, version + 1)
    if rank == 0:
        obstacle.mkdir()
    try:
        publisher.publish()
    except OSError as e:
        error = (type(e).__name__, str(e))
    else:
        error = None
    if rank == 0:
        obstacle.rmdir()
    return error, publisher.version == version
