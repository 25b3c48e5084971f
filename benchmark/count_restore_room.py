"""Keys a full NO_EVICTION table loses when restored, and how long the restore takes.

A ``ScoredHashTable`` (NO_EVICTION, dim 16, buckets of 128, init capacity = capacity
= ``--slots``) is filled by batches of ``slots / 64`` random keys up to its first
failed insert (a load of ~0.97), exported in slot order (a dump's order), then
restored into a fresh table of the same options: in slot order and in a random order,
in one ``restore`` call and in calls of 65,536 keys (a checkpoint load's batches). A
key that finds both its buckets full fails unless the restore makes room
(csrc/core/tile_room.h); the figure to compare between commits is ``lost_keys``.

Usage::

    PYTHONPATH=. python benchmark/count_restore_room.py [--slots 1048576] [--seed 0]
                                                        [--quick]

Output: JSON lines on stdout (``common.Recorder``), a table on stderr.
"""

import argparse
import time

import torch
from common import Recorder, commit_hash

import dynemb

_LOAD_BATCH = 65_536  # dynemb/checkpoint's restore batches


def _table(slots: int) -> dynemb.ScoredHashTable:
    return dynemb.ScoredHashTable(
        dim=16, capacity=slots, init_capacity=slots, bucket_capacity=128,
        score_strategy=dynemb.DynamicEmbScoreStrategy.NO_EVICTION,
    )  # fmt: skip


def _filled(slots: int, seed: int) -> dynemb.ScoredHashTable:
    table = _table(slots)
    g = torch.Generator().manual_seed(seed)
    while True:
        keys = torch.randint(-(1 << 62), 1 << 62, (max(slots // 64, 1),), generator=g)
        table.find_or_insert(keys)
        if table.last_stats.failed:
            return table


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--slots", type=int, default=1 << 20, help="table capacity")
    parser.add_argument("--seed", type=int, default=0, help="key seed")
    parser.add_argument("--quick", action="store_true", help="2^14 slots (CI)")
    args = parser.parse_args(argv)
    slots = 1 << 14 if args.quick else args.slots
    if slots < 128:
        parser.error(f"--slots must be >= 128, got {slots}")
    torch.set_num_threads(1)
    saved = _filled(slots, args.seed)
    keys, values, _, _ = saved.export_batch(0, saved.capacity())
    n = keys.numel()
    shuffled = torch.randperm(n, generator=torch.Generator().manual_seed(args.seed + 1))
    rec = Recorder(commit_hash())
    impl = "dynemb.ScoredHashTable.restore"
    for order, positions in (("slot", torch.arange(n)), ("random", shuffled)):
        for batch in (n, _LOAD_BATCH) if n > _LOAD_BATCH else (n,):
            table = _table(slots)
            start = time.perf_counter()
            for s in range(0, n, batch):
                p = positions[s : s + batch]
                table.restore(keys[p], values[p])
            seconds = time.perf_counter() - start
            variant = f"slots={slots},load={n / slots:.3f},order={order},batch={min(batch, n)}"
            rec.add("W-restore", impl, f"lost_keys@{variant}", n - table.size(), threads=1)
            rec.add("W-restore", impl, f"seconds@{variant}", seconds, threads=1)
    rec.print_table()


if __name__ == "__main__":
    main()
