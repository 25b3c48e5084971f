"""Rank-side code of tests/checkpoint/test_checkpoint_across_plans.py: one model of two
dynamic tables trained row-wise on 4 ranks, dumped, and loaded into other plans and world
sizes (table-wise on 2, column-wise on 2, row-wise on 4 again; table-row-wise on 2 nodes
of 2), each load dumped for the
next. Every stage returns what its ranks hold, as whole rows, and the outputs of the
next forward of the global batch."""

import dataclasses
import os

import torch
import torch.distributed as dist
from torchrec import (
    EmbeddingBagCollection,
    EmbeddingBagConfig,
    EmbeddingCollection,
    EmbeddingConfig,
)
from torchrec.distributed.sharding_plan import (
    column_wise,
    construct_module_sharding_plan,
    row_wise,
    table_row_wise,
    table_wise,
)

from dynemb import DynamicEmbScoreStrategy
from dynemb.checkpoint import DynamicEmbDump, DynamicEmbLoad
from dynemb.optimizer import EmbOptimType
from dynemb.shard import (
    DynamicEmbeddingBagCollectionSharder,
    DynamicEmbeddingCollectionSharder,
    dynamic_embedding_tables,
)
from tests.support.plan_entries import dynamic_entry, sharded_model
from tests.support.sharded_workers import table_options
from tests.support.table_wise_workers import entries, global_batch, local_kjt, out_grad

DIMS = {"a": 8, "b": 8}  # table -> dim (TorchRec cuts 4 columns or more per slice)
FEATURES = ["f0", "f1"]
GLOBAL_BATCH = 8
STEPS = 4
LR = 0.05
# Each plan: table -> (sharding type, ranks). b's slices lie on the ranks in reverse.
PLANS = {
    "row_wise": {"a": ("row_wise", None), "b": ("row_wise", None)},
    "table_wise": {"a": ("table_wise", [1]), "b": ("table_wise", [0])},
    "column_wise": {"a": ("column_wise", [0, 1]), "b": ("column_wise", [1, 0])},
    "one_slice": {"a": ("column_wise", [1]), "b": ("column_wise", [0, 1])},  # a: whole
    # Table-row-wise on nodes of LOCAL ranks: a on the last node, b on the first.
    "table_row_wise": {"a": ("table_row_wise", [-1]), "b": ("table_row_wise", [0])},
}
LOCAL = 2  # TorchRec's node size of the table-row-wise plan


@dataclasses.dataclass(frozen=True)
class Case:
    optimizer: str
    sequence: bool = False  # an EmbeddingCollection (one row per id), else an EBC (SUM)

    @property
    def name(self) -> str:
        return self.optimizer + ("-sequence" if self.sequence else "")

    def fused_params(self) -> dict:
        return {"optimizer": EmbOptimType[self.optimizer], "learning_rate": LR, "eps": 1e-3}


def build_model(case: Case, plan: str, world_size: int, **fields):
    """``case``'s model under ``plan``; ``fields``: more DynamicEmbTableOptions of every
    table."""
    config, collection, sharder = (
        (EmbeddingConfig, EmbeddingCollection, DynamicEmbeddingCollectionSharder)
        if case.sequence
        else (EmbeddingBagConfig, EmbeddingBagCollection, DynamicEmbeddingBagCollectionSharder)
    )
    configs = [
        config(name=name, embedding_dim=dim, num_embeddings=40, feature_names=[f])
        for (name, dim), f in zip(DIMS.items(), FEATURES)
    ]
    module = collection(tables=configs, device=torch.device("meta"))
    sharder = sharder(fused_params=case.fused_params())
    make = {"row_wise": lambda ranks: row_wise(compute_kernel="customized_kernel"),
            "table_wise": lambda ranks: table_wise(rank=ranks[0], compute_kernel="customized_kernel"),
            "column_wise": lambda ranks: column_wise(ranks=ranks, compute_kernel="customized_kernel"),
            "table_row_wise": lambda nodes: table_row_wise(host_index=nodes[0] % (world_size // LOCAL))}  # fmt: skip
    per_param = {name: make[kind](ranks) for name, (kind, ranks) in PLANS[plan].items()}
    local_size = LOCAL if plan == "table_row_wise" else world_size
    os.environ["LOCAL_WORLD_SIZE"] = str(local_size)  # TorchRec's node size
    mplan = construct_module_sharding_plan(
        module, per_param_sharding=per_param, local_size=local_size, world_size=world_size,
        device_type="cpu", sharder=sharder,
    )  # fmt: skip
    for name, dim in DIMS.items():  # table_row_wise() names no compute kernel
        options = dataclasses.replace(serving_options(dim), **fields)
        mplan[name] = dynamic_entry(mplan[name], options, compute_kernel="customized_kernel")
    return sharded_model(module, mplan, sharder)


def serving_options(dim: int):
    """Every table's options (a serving module's too)."""
    options = table_options(dim, "hash_roundrobin", 256)
    options.bucket_capacity = 16
    options.score_strategy = DynamicEmbScoreStrategy.STEP
    return options


def _samples(rank: int, world_size: int) -> tuple[int, int]:
    per_rank = GLOBAL_BATCH // world_size
    return rank * per_rank, (rank + 1) * per_rank


def step(model, rank: int, world_size: int, step: int, backward: bool = True) -> torch.Tensor:
    """One step of the global batch ``step``; returns the whole batch's outputs (every
    rank's samples, gathered; an EmbeddingCollection's rows feature by feature)."""
    start, stop = _samples(rank, world_size)
    lengths, keys = global_batch(step, GLOBAL_BATCH, len(FEATURES))
    out = model(local_kjt(lengths, keys, start, stop))
    if not hasattr(out, "to_dict"):  # EmbeddingCollection: each id's row
        parts = [out[f].values() for f in FEATURES]
        values = torch.cat(parts)
        grad = out_grad(step, values.shape[0], values.shape[1])
    else:
        values = torch.cat([out.to_dict()[f] for f in FEATURES], dim=1)
        parts = [values]
        grad = out_grad(step, GLOBAL_BATCH, sum(DIMS.values()))[start:stop]
    if backward:
        (values * grad).sum().backward()
    gathered = [None] * world_size
    dist.all_gather_object(gathered, [p.detach() for p in parts])
    return torch.cat([torch.cat([g[i] for g in gathered]) for i in range(len(parts))])


def held(model) -> dict[str, dict]:
    """Every rank's pieces of every dynamic table: name -> [(rank, column_offset,
    entries)] (column_offset 0 for a whole table or a row-wise share)."""
    mine = []
    for group in dynamic_embedding_tables(model).values():
        for name, options, table in zip(group.table_names, group.table_options, group.tables):
            mine.append((name, options.column_offset, entries(table)))
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, mine)
    out: dict[str, list] = {}
    for rank, pieces in enumerate(gathered):
        for name, offset, got in pieces:
            out.setdefault(name, []).append((rank, offset, got))
    return out


def train_and_dump(rank: int, world_size: int, cases: list[Case], path: str):
    """Row-wise on ``world_size`` ranks: per case, trains STEPS steps, dumps to
    ``path/<optimizer>/row_wise``; returns (held, the next step's outputs)."""
    results = []
    for case in cases:
        model = build_model(case, "row_wise", world_size)
        for s in range(STEPS):
            step(model, rank, world_size, s)
        DynamicEmbDump(f"{path}/{case.name}/row_wise", model, optim=True)
        results.append((held(model), step(model, rank, world_size, STEPS, backward=False)))
    return results if rank == 0 else None


def load_dump(model, rank: int, world_size: int, source: str, target: str | None):
    DynamicEmbLoad(source, model, optim=True)
    pieces = held(model)
    if target is not None:
        DynamicEmbDump(target, model, optim=True)
    return pieces, step(model, rank, world_size, STEPS, backward=False)


def through_two_ranks(rank: int, world_size: int, cases: list[Case], path: str):
    """On 2 ranks, per case: loads row_wise into the table-wise plan and dumps it
    (table_wise), loads that into the column-wise plan and dumps it (column_wise);
    then trains the column-wise model 2 more steps (its slices' row-wise Adagrad
    states part), dumps it (cw_trained) and loads that into a fresh column-wise
    model. Returns per case: (held, next outputs) of the three loads and the held
    of the trained column-wise model."""
    results = []
    for case in cases:
        base = f"{path}/{case.name}"
        tw = build_model(case, "table_wise", world_size)
        by_tw = load_dump(tw, rank, world_size, f"{base}/row_wise", f"{base}/table_wise")
        cw = build_model(case, "column_wise", world_size)
        by_cw = load_dump(cw, rank, world_size, f"{base}/table_wise", f"{base}/column_wise")
        cw = build_model(case, "column_wise", world_size)
        DynamicEmbLoad(f"{base}/column_wise", cw, optim=True)
        for s in range(STEPS, STEPS + 2):
            step(cw, rank, world_size, s)
        DynamicEmbDump(f"{base}/cw_trained", cw, optim=True)
        trained = held(cw)
        again = load_dump(
            build_model(case, "column_wise", world_size), rank, world_size,
            f"{base}/cw_trained", None,
        )  # fmt: skip
        results.append((by_tw, by_cw, again, trained))
    return results if rank == 0 else None


def back_to_row_wise(rank: int, world_size: int, cases: list[Case], path: str):
    """Row-wise on ``world_size`` ranks, per case: loads column_wise (the chain's end)
    and cw_trained; returns their (held, next outputs)."""
    results = []
    for case in cases:
        base = f"{path}/{case.name}"
        loads = [
            load_dump(build_model(case, "row_wise", world_size), rank, world_size, source, None)
            for source in (f"{base}/column_wise", f"{base}/cw_trained")
        ]
        results.append(loads)
    return results if rank == 0 else None


def through_table_row_wise(rank: int, world_size: int, cases: list[Case], path: str):
    """On ``world_size`` ranks (nodes of LOCAL), per case: loads row_wise into the
    table-row-wise plan and dumps it (table_row_wise), then loads that into the row-wise
    plan; returns the (held, next outputs) of both loads."""
    results = []
    for case in cases:
        base = f"{path}/{case.name}"
        twrw = build_model(case, "table_row_wise", world_size)
        by_twrw = load_dump(twrw, rank, world_size, f"{base}/row_wise", f"{base}/table_row_wise")
        rw = build_model(case, "row_wise", world_size)
        results.append((by_twrw, load_dump(rw, rank, world_size, f"{base}/table_row_wise", None)))
    return results if rank == 0 else None


def incremental_under_plans(rank: int, world_size: int, case: Case, path: str, plans: tuple):
    """Per plan of ``plans`` (on 2 ranks: table-wise, column-wise, a column-wise table
    of one slice beside one of two; on 4: table-row-wise on 2 nodes): loads row_wise,
    trains one step from a score reference and dumps incrementally over the group;
    returns per plan (the dump, held after the step), and with the column-wise plan
    what slices that disagree raise."""
    from dynemb.incremental_dump import get_score, incremental_dump

    results, models = {}, {}
    for plan in plans:
        model = models[plan] = build_model(case, plan, world_size)
        DynamicEmbLoad(f"{path}/{case.name}/row_wise", model, optim=True)
        before = get_score(model)
        step(model, rank, world_size, STEPS)
        dumped, _ = incremental_dump(model, before, dist.group.WORLD, with_scores=True)
        results[plan] = (dumped["model"], held(model))
    if "column_wise" in models:
        results["disagree"] = _slices_that_disagree(models["column_wise"], rank, path)
    return results if rank == 0 else None


def _slices_that_disagree(model, rank: int, path: str) -> list[str]:
    """The column-wise ``model`` with a key erased from rank 1's slices only: what
    DynamicEmbDump and incremental_dump raise (every rank gets the outcome)."""
    from dynemb.incremental_dump import incremental_dump
    from tests.support.sharded_workers import dynamic_tables

    if rank == 1:
        assert dynamic_tables(model)["a"].erase(erased_keys()[:1]) == 1
    errors = []
    for attempt in (
        lambda: DynamicEmbDump(f"{path}/disagree", model, optim=True),
        lambda: incremental_dump(model, 0, dist.group.WORLD),
    ):
        try:
            attempt()
            errors.append(None)
        except RuntimeError as e:
            errors.append(f"{type(e).__name__}: {e}")
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, errors)
    return gathered


def publish_under_plans(rank: int, world_size: int, case: Case, root: str, plans: tuple):
    """Per plan of ``plans``: trains STEPS steps with a DeltaPublisher (optim=True): the
    base after step 0, a delta after each later step; before the last, every rank
    erases from what it holds of table a three keys of step 0 (tombstones). Returns per
    plan (the last version, held at the end, the serving rows of load_from_model, every
    rank's count of erased keys: 3 on each holder of a whole row, 3 in all over a
    table-row-wise table's shares)."""
    from dynemb.deltas import DeltaPublisher
    from tests.support.sharded_workers import dynamic_tables

    results = {}
    for plan in plans:
        model = build_model(case, plan, world_size)
        publisher = DeltaPublisher(model, f"{root}/{plan}", optim=True, fault_timeout=20)
        erased = None
        for s in range(STEPS):
            step(model, rank, world_size, s)
            if s == STEPS - 1 and "a" in dynamic_tables(model):
                erased = dynamic_tables(model)["a"].erase(erased_keys())
            assert (publisher.publish() if s else publisher.publish_base()) == s
        publisher.close()
        counts = [None] * world_size
        dist.all_gather_object(counts, erased)
        results[plan] = (publisher.version, held(model), _served_from_model(model), counts)
    return results if rank == 0 else None


def seen_keys() -> tuple[torch.Tensor, torch.Tensor]:
    """Every key of tables a and b over the STEPS batches: ``(keys, offsets)`` of a
    lookup of one bag per key, feature by feature (as many bags in each)."""
    per_table = [[], []]
    for s in range(STEPS):
        lengths, keys = global_batch(s, GLOBAL_BATCH, len(FEATURES))
        first = int(lengths[0].sum())
        per_table[0].append(keys[:first])
        per_table[1].append(keys[first:])
    unique = [torch.cat(k).unique() for k in per_table]
    bags = max(k.numel() for k in unique)
    lengths = torch.tensor([[1] * k.numel() + [0] * (bags - k.numel()) for k in unique])
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.flatten().cumsum(0)])
    return torch.cat(unique), offsets


def _served_from_model(model) -> tuple[list[int], torch.Tensor]:
    """A serving module filled by load_from_model (every rank's rows, gathered): its
    sizes and its rows of every key seen."""
    from dynemb.inference.exportable_tables import InferenceEmbeddingCollection

    serving = InferenceEmbeddingCollection(
        [serving_options(dim) for dim in DIMS.values()], table_names=list(DIMS)
    )
    serving.load_from_model(model)
    return serving.sizes, serving(*seen_keys())


def erased_keys() -> torch.Tensor:
    """Three keys of table a (feature f0) stored since step 0."""
    lengths, keys = global_batch(0, GLOBAL_BATCH, len(FEATURES))
    return keys[: int(lengths[0].sum())].unique()[:3]
