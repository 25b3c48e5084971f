"""What decayed frequency scores cost: W-table's find_or_insert under DECAYED_LFU beside
LFU (benchmark/README.md, "W-decay").

Usage::

    python benchmark/bench_decayed_scores.py [--quick] [--repeats N] [--threads N]

Two tables of 2^21 slots (buckets of 128, dim 16 float32), one LFU and one DECAYED_LFU
(half-life 100 steps), are filled alike to load factor 0.75 with random 63-bit keys
(generator seed 0, batches of 2^18; the keys resident in both are the hits). Each timed op is ``find_or_insert`` of 2^18 keys on
both tables in turn (an LFU run, then a DECAYED_LFU run, in every repeat, so a burst
of load on a shared machine hits both), each from its pre-filled state (``snapshot``
/ ``rollback``, untimed); the median of the repeats after one warm-up:

- ``hits``: resident keys only: every key updates its score (LFU: an add; DECAYED_LFU:
  a fixed-point power and logarithm, core/decay.h).
- ``mixed``: half resident, half new keys; the tables are at capacity, so new keys in
  full buckets evict.

The peer is the same op on the LFU table, so the ratio is the decayed score's cost.
The host's probes are recorded first (``host.record_host``). Output: JSON lines on
stdout, a table on stderr.
"""

import argparse
import statistics
import time

import torch
from common import Recorder, commit_hash, progress, set_threads
from host import record_host

import dynemb
from dynemb import DynamicEmbScoreStrategy as S


def _table(strategy, slots: int) -> dynemb.ScoredHashTable:
    half_life = 100 if strategy == S.DECAYED_LFU else None
    return dynemb.ScoredHashTable(
        dim=16, capacity=slots, bucket_capacity=128, score_strategy=strategy,
        score_half_life_steps=half_life,
    )  # fmt: skip


def _prefill(tables, slots: int, batch: int, gen: torch.Generator) -> torch.Tensor:
    keys = torch.randint(-(2**63), 2**63 - 1, (slots * 3 // 4,), generator=gen)
    for begin in range(0, keys.numel(), batch):
        part = keys[begin : begin + batch]
        for t in tables:
            t.find_or_insert(part)
    # A few keys landing in full buckets evict, by each table's own scores: the keys
    # resident in both tables are the hits.
    return keys[tables[0].contains(keys) & tables[1].contains(keys)]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, for CI smoke runs")
    parser.add_argument("--repeats", type=int, default=5, help="timed runs per figure")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    args = parser.parse_args(argv)
    threads = set_threads(args.threads)
    slots, batch = (1 << 14, 1 << 11) if args.quick else (1 << 21, 1 << 18)
    rec = Recorder(commit=commit_hash())
    record_host(rec, quick=args.quick)
    gen = torch.Generator().manual_seed(0)
    lfu, decayed = _table(S.LFU, slots), _table(S.DECAYED_LFU, slots)
    resident = _prefill([lfu, decayed], slots, batch, gen)
    snapshots = {id(t): t.snapshot() for t in (lfu, decayed)}
    hits = resident[torch.randperm(resident.numel(), generator=gen)[:batch]]
    new = torch.randint(-(2**63), 2**63 - 1, (batch // 2,), generator=gen)
    mixed = torch.cat([hits[: batch // 2], new])[torch.randperm(batch, generator=gen)]
    for name, keys in (("hits", hits), ("mixed", mixed)):
        times = {id(lfu): [], id(decayed): []}
        for i in progress(range(1 + args.repeats), name):
            for table in (lfu, decayed):
                table.rollback(snapshots[id(table)])
                start = time.perf_counter()
                table.find_or_insert(keys)
                if i:  # the first run warms up
                    times[id(table)].append(time.perf_counter() - start)
        got, peer = (statistics.median(times[id(t)]) for t in (decayed, lfu))
        rec.add(
            "W-decay", "dynemb DECAYED_LFU", f"find_or_insert_{name}_mkeys_per_s",
            batch / got / 1e6, threads=threads, peer="dynemb LFU",
            peer_value=batch / peer / 1e6,
        )  # fmt: skip
    rec.print_table()


if __name__ == "__main__":
    main()
