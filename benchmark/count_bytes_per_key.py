"""Table bytes and 64-byte cache lines per key of find and find_or_insert, counted
on the emulated CUDA executor: every metadata access (digests, keys, scores,
timestamps, pins, overflow flags, bucket locks) and row access of the table core goes
through TableRef's accessors, which report it there (csrc/core/access_count.h).

Usage::

    python benchmark/count_bytes_per_key.py [--quick]

Host-independent: the counts depend on the code and the table's contents, not the
machine. Each key is looked up in an op of its own, and the count, emptied before each
op, holds the distinct bytes and lines that op touched: the figures are per key, with
nothing shared with a neighbour's key (a lock word or an overflow flag shares its line
with other buckets' in a batch). Tables: 2^16 slots in buckets of 128, dim 64 float32
rows, random 63-bit keys (seed 0); NO_EVICTION and TIMESTAMP (evicting) at load factor
0.75 (W-table's), NO_EVICTION at 0.95 (where it grows), and TIMESTAMP full (every bucket
full: a new key evicts). Ops: find of stored keys; find of absent keys; under NO_EVICTION,
find of the stored keys that sit in their second bucket; find_or_insert of half stored,
half new keys. Output: a JSON line per (table, op): the mean per key of each count
(``bytes_meta_read`` ... ``lines_row``).
"""

import argparse
import json
import os

os.environ["DYNEMB_EXECUTOR"] = "cuda-emulated"  # read once, when dynemb is imported

import torch

from dynemb import _ops
from dynemb.table.scored_hash_table import ScoredHashTable
from dynemb.types import DynamicEmbScoreStrategy

SLOTS = 1 << 16
DIM = 64


def filled(strategy: DynamicEmbScoreStrategy, load: float, gen: torch.Generator):
    """A table of SLOTS slots and the keys it holds after inserting load * SLOTS keys
    (twice SLOTS for load 1.0: every bucket ends full, evicting)."""
    table = ScoredHashTable(dim=DIM, capacity=SLOTS, init_capacity=SLOTS, score_strategy=strategy)
    n = int(load * SLOTS) if load < 1.0 else 2 * SLOTS
    keys = torch.randint(0, 2**63 - 1, (n,), generator=gen)
    for chunk in keys.split(1 << 10):
        table.find_or_insert(chunk)
    _, found = table.find(keys)
    return table, keys[found]


def per_key(call, keys: torch.Tensor) -> dict[str, float]:
    """The mean of each access count over ops of one key each."""
    total: dict[str, int] = {}
    _ops.emulation_count_accesses(True)
    try:
        for k in keys.split(1):
            _ops.emulation_accesses(reset=True)
            call(k)
            for name, v in _ops.emulation_accesses(reset=True).items():
                total[name] = total.get(name, 0) + v
    finally:
        _ops.emulation_count_accesses(False)
    return {name: round(v / keys.numel(), 2) for name, v in total.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer keys counted")
    parser.add_argument("--keys", type=int, default=512, help="keys counted per op")
    args = parser.parse_args()
    count = 32 if args.quick else args.keys
    gen = torch.Generator().manual_seed(0)
    cases = [
        ("NO_EVICTION, load 0.75", DynamicEmbScoreStrategy.NO_EVICTION, 0.75),
        ("NO_EVICTION, load 0.95", DynamicEmbScoreStrategy.NO_EVICTION, 0.95),
        ("TIMESTAMP, load 0.75", DynamicEmbScoreStrategy.TIMESTAMP, 0.75),
        ("TIMESTAMP, full", DynamicEmbScoreStrategy.TIMESTAMP, 1.0),
    ]
    for name, strategy, load in cases:
        table, stored = filled(strategy, load, gen)
        hits = stored[torch.randperm(stored.numel(), generator=gen)[:count]]
        new = torch.randint(0, 2**63 - 1, (count,), generator=gen)
        mixed = torch.stack([hits, new], dim=1).flatten()[:count]  # half stored, half new
        homes, _ = _ops.hash_keys(stored, table.buffers.num_buckets)
        in_second = stored[
            table.find_slots(stored) // table.buffers.layout.bucket_capacity != homes
        ]
        find = lambda k, t=table: t.find(k)  # noqa: E731
        ops = [("find", find, hits), ("find (absent)", find, new)]
        if strategy == DynamicEmbScoreStrategy.NO_EVICTION and in_second.numel():
            ops.append(("find (in the second bucket)", find, in_second[:count]))
        ops.append(("find_or_insert (half new)", lambda k, t=table: t.find_or_insert(k), mixed))
        for op, call, keys in ops:
            row = {"table": name, "op": op, "keys": keys.numel(), **per_key(call, keys)}
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
