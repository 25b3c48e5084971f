"""Rank-side code of tests/checkpoint/test_incremental_dump.py (run on real gloo ranks)."""

import torch
import torch.distributed as dist
from torchrec import KeyedJaggedTensor

from dynemb.incremental_dump import get_score, incremental_dump
from tests.support.sharded_workers import (
    FEATURES,
    Case,
    build_model,
    dynamic_tables,
    global_batch,
    local_kjt,
)

# The keys each rank trains on after taking the score reference, per feature
# (f0, f1 -> table t0; f2 -> table t1). 99 and 1 << 50 are new keys.
TOUCHED = {
    0: {"f0": [5, 1 << 40], "f1": [-7], "f2": [13]},
    1: {"f0": [2], "f1": [99, 5], "f2": [1 << 50]},
}


class FakeClock:
    """Replaces a table's ``time.monotonic_ns``: time moves only when a test says so."""

    def __init__(self, now: int) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


def _train_step(model, kjt: KeyedJaggedTensor) -> None:
    model(kjt).values().sum().backward()


def _one_sample(keys_per_feature: dict) -> KeyedJaggedTensor:
    values = [torch.tensor(keys_per_feature[f], dtype=torch.int64) for f in FEATURES]
    return KeyedJaggedTensor(
        keys=FEATURES,
        values=torch.cat(values),
        lengths=torch.tensor([v.numel() for v in values], dtype=torch.int64),
    )


def dump_after_training(rank: int, world_size: int) -> dict:
    """Trains, takes get_score, dumps (nothing touched), trains on TOUCHED, dumps again."""
    clock = FakeClock(1_000_000)
    model = build_model(Case("EXACT_SGD", "roundrobin"), world_size)
    tables = dynamic_tables(model)
    for table in tables.values():
        table.state.clock = clock
    batch = 2
    for step in range(3):
        clock.now += 10
        lengths, keys, _ = global_batch(step, batch * world_size, False)
        _train_step(model, local_kjt(lengths, keys, None, rank * batch, (rank + 1) * batch))
    clock.now += 10
    before = get_score(model)
    world = dist.group.WORLD  # gathered from every rank; dynemb's scores too
    nothing, _ = incremental_dump(model, before, world, with_scores=True)
    clock.now += 10
    _train_step(model, _one_sample(TOUCHED[rank]))
    touched, current = incremental_dump(model, before, world, with_scores=True)
    everything, _ = incremental_dump(model, 0, world, with_scores=True)
    local = {}
    for name, table in tables.items():
        k, rows, scores, _ = table.export_batch(0, table.capacity())
        local[name] = (k, rows, scores)
    return {
        "before": before,
        "nothing": nothing,
        "touched": touched,
        "current": current,
        "everything": everything,
        "local": local,
        "clock": clock.now,
    }
