"""Rank-side code of tests/checkpoint/test_checkpoint.py: train a sharded model, dump, load, continue."""

import dataclasses

import torch
import torch.distributed as dist

from dynemb.checkpoint import DynamicEmbDump, DynamicEmbLoad
from tests.support.sharded_workers import (
    Case,
    build_model,
    dynamic_tables,
    global_batch,
    local_kjt,
    out_grad,
)

DUMP_STEP = 5  # train steps [0, 5), dump, then [5, 10)
STEPS = 10


def train(model, rank: int, batch_sizes: list[int], steps: range) -> list[torch.Tensor]:
    start = sum(batch_sizes[:rank])
    stop, total = start + batch_sizes[rank], sum(batch_sizes)
    outputs = []
    for step in steps:
        lengths, keys, weights = global_batch(step, total, False)
        values = model(local_kjt(lengths, keys, weights, start, stop)).values()
        (values * out_grad(step, total, values.shape[1])[start:stop]).sum().backward()
        outputs.append(values.detach().clone())
    return outputs


def contents(model) -> dict:
    """Table name -> (keys, rows with optimizer state, scores) held by this rank."""
    out = {}
    for name, table in dynamic_tables(model).items():
        keys, rows, scores, _ = table.export_batch(0, table.capacity(), include_extra=True)
        out[name] = (keys, rows, scores)
    return out


def dump_then_continue(rank, world_size, case: Case, path: str, batch_sizes: list[int]):
    model = build_model(case, world_size)
    train(model, rank, batch_sizes, range(DUMP_STEP))
    DynamicEmbDump(path, model, optim=True)
    saved = contents(model)
    return saved, train(model, rank, batch_sizes, range(DUMP_STEP, STEPS))


def load_then_continue(rank, world_size, case: Case, path: str, batch_sizes, redump: str | None):
    model = build_model(case, world_size)
    DynamicEmbLoad(path, model, optim=True)
    loaded = contents(model)
    if redump:
        DynamicEmbDump(redump, model, optim=True)
    outputs = train(model, rank, batch_sizes, range(DUMP_STEP, STEPS)) if batch_sizes else None
    return loaded, outputs


def with_dist_type(case: Case, dist_type: str) -> Case:
    return dataclasses.replace(case, dist_type=dist_type)


def reshard(rank, world_size, case: Case, root: str, sources: dict, targets: list) -> dict:
    """Dumps a model trained on the first N ranks for each N of ``sources`` (N -> per-rank
    batch sizes), then loads each dump into a model on the first M ranks for each
    ``(M, dist_type)`` of ``targets``: every world size runs on a group of this one
    world (a group of M ranks is an M-rank world to the model and the checkpoint).

    Returns:
        ``{("saved", N): contents at the dump, ("loaded", N, M): contents after the
        load}`` for the groups this rank belongs to.
    """
    sizes = sorted({*sources, *(m for m, _ in targets)})
    groups = {  # every rank creates each group, in the same order
        n: dist.group.WORLD if n == world_size else dist.new_group(list(range(n))) for n in sizes
    }
    out = {}
    for n, batch_sizes in sources.items():
        if rank < n:
            model = build_model(case, n, groups[n])
            train(model, rank, batch_sizes, range(DUMP_STEP))
            DynamicEmbDump(f"{root}/from{n}", model, optim=True, pg=groups[n])
            out["saved", n] = contents(model)
        dist.barrier()  # the dump is committed before any rank reads it
    for n in sources:
        for m, dist_type in targets:
            if rank < m:
                model = build_model(with_dist_type(case, dist_type), m, groups[m])
                DynamicEmbLoad(f"{root}/from{n}", model, optim=True, pg=groups[m])
                out["loaded", n, m] = contents(model)
    return out
