"""Rank-side code of tests/shard/test_table_wise.py: one model with a dynamic table sharded
table-wise, a dynamic table sharded row-wise and an ordinary TorchRec table, trained on
real gloo ranks and compared with one unsharded BatchedDynamicEmbeddingTables."""

import dataclasses

import torch
import torch.distributed as dist
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor
from torchrec.distributed.comm_ops import get_gradient_division
from torchrec.distributed.sharding_plan import (
    construct_module_sharding_plan,
    row_wise,
    table_wise,
)
from torchrec.modules.embedding_configs import PoolingType

from dynemb import (
    BatchedDynamicEmbeddingTables,
    DynamicEmbPoolingMode,
    DynamicEmbScoreStrategy,
)
from dynemb.optimizer import optimizer_type_of
from dynemb.shard import DynamicEmbeddingBagCollectionSharder
from tests.support.ftrl_reference import optimizer_kwargs
from tests.support.plan_entries import dynamic_entry, sharded_model
from tests.support.sharded_workers import dynamic_tables, table_options

ROWS = 40  # num_embeddings of every table (nominal for the dynamic ones)
DIMS = {"tw": 4, "rw": 8, "ord": 4}
FEATURES = ["f0", "f1", "f2"]  # one per table, in DIMS' order
SMALL = 16  # the evicting table's capacity: one bucket, fewer slots than its keys
LARGE = 256
BATCH = 4  # samples per rank
STEPS = 10
LR = 0.05
# fbgemm's CPU kernel (the ordinary table's) has no Adam: that case leaves it out.
ORDINARY_OPTIMIZERS = ("EXACT_SGD", "EXACT_ROWWISE_ADAGRAD")


@dataclasses.dataclass(frozen=True)
class Case:
    optimizer: str
    pooling: str  # SUM / MEAN
    tw_rank: int = 1  # the rank holding the table-wise dynamic table

    @property
    def ordinary(self) -> bool:
        return self.optimizer in ORDINARY_OPTIMIZERS

    def tables(self) -> list[str]:
        return ["tw", "rw", "ord"] if self.ordinary else ["tw", "rw"]

    def fused_params(self) -> dict:
        return {
            "optimizer": optimizer_type_of(self.optimizer), "learning_rate": LR, "eps": 1e-3,
            **optimizer_kwargs(self.optimizer),
        }  # fmt: skip


def ordinary_rows() -> torch.Tensor:
    """The ordinary table's initial rows (its init_fn on the whole table)."""
    return torch.rand(ROWS, DIMS["ord"], generator=torch.Generator().manual_seed(11)) - 0.5


def _init(weight: torch.Tensor) -> torch.Tensor:
    if weight.numel() == 0:  # a rank that does not hold the table-wise table
        return weight
    with torch.no_grad():
        return weight.copy_(ordinary_rows())


def _configs(case: Case) -> list[EmbeddingBagConfig]:
    pooling = PoolingType[case.pooling]
    return [
        EmbeddingBagConfig(
            name=name,
            embedding_dim=DIMS[name],
            num_embeddings=ROWS,
            feature_names=[feature],
            pooling=pooling,
            init_fn=_init if name == "ord" else None,
        )
        for name, feature in zip(case.tables(), FEATURES)
    ]


def dynamic_options(name: str, sharding_type: str):
    """Options of a dynamic table on each rank holding it: the table-wise one small
    (it evicts) and as the unsharded reference's, the row-wise one large."""
    capacity = SMALL if (name, sharding_type) == ("tw", "table_wise") else LARGE
    options = table_options(DIMS[name], "hash_roundrobin", capacity)
    options.bucket_capacity = SMALL
    options.score_strategy = DynamicEmbScoreStrategy.STEP  # scores comparable across runs
    return options


def build_model(case: Case, world_size: int, plan_types: dict[str, str] | None = None):
    """The sharded model; ``plan_types``: table -> sharding type of the dynamic tables
    (default: tw table-wise on ``case.tw_rank``, rw row-wise)."""
    plan_types = plan_types or {"tw": "table_wise", "rw": "row_wise"}
    module = EmbeddingBagCollection(tables=_configs(case), device=torch.device("meta"))
    sharder = DynamicEmbeddingBagCollectionSharder(fused_params=case.fused_params())
    per_param = {}
    for name, kind in plan_types.items():
        if kind == "table_wise":
            per_param[name] = table_wise(rank=case.tw_rank, compute_kernel="customized_kernel")
        else:
            per_param[name] = row_wise(compute_kernel="customized_kernel")
    if case.ordinary:
        per_param["ord"] = table_wise(rank=0, compute_kernel="fused")
    mplan = construct_module_sharding_plan(
        module, per_param_sharding=per_param, local_size=world_size, world_size=world_size,
        device_type="cpu", sharder=sharder,
    )  # fmt: skip
    for name, kind in plan_types.items():
        mplan[name] = dynamic_entry(mplan[name], dynamic_options(name, kind))
    return sharded_model(module, mplan, sharder)


def global_batch(step: int, batch_size: int, features: int):
    """Feature-major lengths (features, batch) and keys, the same on every rank: raw
    ids far beyond num_embeddings for the dynamic tables, rows for the ordinary one."""
    g = torch.Generator().manual_seed(500 + step)
    lengths = torch.randint(0, 3, (features, batch_size), generator=g)
    parts = []
    for f in range(features):
        n = int(lengths[f].sum())
        ids = torch.randint(0, ROWS, (n,), generator=g)
        parts.append(ids if f == 2 else ids * (1 << 40) - 3)
    return lengths, torch.cat(parts)


def local_kjt(lengths, keys, start: int, stop: int) -> KeyedJaggedTensor:
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.flatten().cumsum(0)])
    f_count, batch = lengths.shape
    parts = [keys[int(offsets[f * batch + start]) : int(offsets[f * batch + stop])]
             for f in range(f_count)]  # fmt: skip
    return KeyedJaggedTensor(
        keys=FEATURES[:f_count], values=torch.cat(parts), lengths=lengths[:, start:stop].flatten()
    )


def out_grad(step: int, rows: int, width: int) -> torch.Tensor:
    return torch.randn(rows, width, generator=torch.Generator().manual_seed(70 + step))


def entries(table) -> dict[str, torch.Tensor]:
    """Every entry of a table, by ascending key: keys, values with the optimizer
    state columns, scores."""
    keys, values, scores, _ = table.export_batch(0, max(1, table.capacity()), include_extra=True)
    order = torch.argsort(keys)
    return {"keys": keys[order], "values": values[order], "scores": scores[order]}


def train(model, case: Case, rank: int, world_size: int, steps: range) -> list[torch.Tensor]:
    """Trains ``steps``; returns this rank's outputs (its samples, features in order)."""
    widths = [DIMS[n] for n in case.tables()]
    outputs = []
    for step in steps:
        lengths, keys = global_batch(step, BATCH * world_size, len(widths))
        out = model(local_kjt(lengths, keys, rank * BATCH, (rank + 1) * BATCH)).to_dict()
        values = torch.cat([out[f] for f in FEATURES[: len(widths)]], dim=1)
        grad = out_grad(step, BATCH * world_size, sum(widths))[rank * BATCH : (rank + 1) * BATCH]
        (values * grad).sum().backward()
        outputs.append(values.detach().clone())
    return outputs


def train_table_wise(rank: int, world_size: int, cases: list[Case]):
    """Per case: this rank's outputs, its dynamic tables' entries, and (on the rank
    holding it) the ordinary table's rows."""
    results = []
    for case in cases:
        model = build_model(case, world_size)
        outputs = train(model, case, rank, world_size, range(STEPS))
        tables = {name: entries(t) for name, t in dynamic_tables(model).items()}
        ordinary = None
        if case.ordinary:
            shards = model.state_dict()["embedding_bags.ord.weight"].local_shards()
            ordinary = shards[0].tensor.clone() if shards else None
        results.append((outputs, tables, ordinary))
    return results


def train_reference(case: Case, world_size: int):
    """The unsharded run on the global batch: the evicting table as small as the
    table-wise one, the ordinary table a dynamic one holding its initial rows."""
    names = case.tables()
    options = [dynamic_options("tw", "table_wise"), dynamic_options("rw", "row_wise")]
    if case.ordinary:
        options.append(dynamic_options("ord", "row_wise"))
    tables = BatchedDynamicEmbeddingTables(
        options,
        list(range(len(names))),
        pooling_mode=DynamicEmbPoolingMode[case.pooling],
        optimizer=optimizer_type_of(case.optimizer),
        learning_rate=LR,
        eps=1e-3,
        **optimizer_kwargs(case.optimizer),
        table_names=names,
    )
    if case.ordinary:
        tables.tables[2].insert_or_assign(torch.arange(ROWS), ordinary_rows())
    # TorchRec divides the embedding gradient by the world size in its collectives.
    scale = 1.0 / world_size if get_gradient_division() else 1.0
    widths = [DIMS[n] for n in names]
    outputs = []
    for step in range(STEPS):
        lengths, keys = global_batch(step, BATCH * world_size, len(names))
        offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.flatten().cumsum(0)])
        out = tables(keys, offsets)
        (out * out_grad(step, BATCH * world_size, sum(widths))).sum().mul(scale).backward()
        outputs.append(out.detach().clone())
    return tables, outputs


def all_entries(model) -> dict[str, dict[str, torch.Tensor]]:
    """Every dynamic table's entries over all ranks, by ascending key."""
    mine = {name: entries(t) for name, t in dynamic_tables(model).items()}
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, mine)
    union = {}
    for name in sorted({n for rank in gathered for n in rank}):
        parts = [rank[name] for rank in gathered if name in rank]
        keys = torch.cat([p["keys"] for p in parts])
        order = torch.argsort(keys)
        union[name] = {f: torch.cat([p[f] for p in parts])[order] for f in parts[0]}
    return union


def checkpoint_between_plans(rank: int, world_size: int, case: Case, path: str):
    """Trains under plan A (tw table-wise, rw row-wise), dumps, loads into plan B (tw
    row-wise, rw table-wise on rank 0), dumps that, loads into a fresh plan A. Returns
    the entries after each step and the outputs of two more steps of each model."""
    from dynemb.dump_load import DynamicEmbDump, DynamicEmbLoad
    from dynemb.incremental_dump import incremental_dump

    swapped = {"tw": "row_wise", "rw": "table_wise"}
    first = build_model(case, world_size)
    train(first, case, rank, world_size, range(STEPS))
    DynamicEmbDump(f"{path}/a", first, optim=True)
    try:  # DynamicEmb's layout has row-wise tables only: every rank refuses
        DynamicEmbDump(f"{path}/c", first, format="dynamicemb")
        refused = None
    except ValueError as e:
        refused = str(e)
    second = build_model(dataclasses.replace(case, tw_rank=0), world_size, swapped)
    DynamicEmbLoad(f"{path}/a", second, optim=True)
    DynamicEmbDump(f"{path}/b", second, optim=True)
    third = build_model(case, world_size)
    DynamicEmbLoad(f"{path}/b", third, optim=True)
    saved = [all_entries(m) for m in (first, second, third)]
    # incremental_dump over the group gathers a table-wise table from its one rank.
    dumped, _ = incremental_dump(first, 0, dist.group.WORLD)
    increments = {name: torch.sort(keys).values for name, (keys, _) in dumped["model"].items()}
    more = range(STEPS, STEPS + 2)
    outputs = [train(m, case, rank, world_size, more) for m in (first, second, third)]
    held = [sorted(dynamic_tables(m)) for m in (first, second, third)]
    return saved, outputs, held, refused, increments
