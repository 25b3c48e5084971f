"""The per-key ops of a training lookup alone: dedup and hash probe on W-train's keys.

Usage::

    python benchmark/bench_dedup_probe.py [--steps N] [--warm N] [--threads N] [--quick]
                                          [--op dedup|probe|both]

One table of W-train (train_workloads.py: dim 64, 65,536 Zipf(1.05) keys per step over
1,000,000 ids, spread to 63 bits), sized like bench_train.py's (2x the distinct keys
of the run, no eviction; EXACT_ROWWISE_ADAGRAD's one state column). Each step calls
what the module's forward calls per table: ``unique_keys(keys)``, then
``ScoredHashTable.find_or_insert_slots(unique, counts)``, each timed alone. Two phases:
the first ``--warm`` steps (most keys inserted) and the steady state after them (most
keys already stored). Prints, per phase, the median thread CPU ms per step (not wall
time: a shared machine's waits for a core are left out) of each op and ns per
key (dedup: per key of the batch; probe: per distinct key), as JSON lines on stdout.
"""

import argparse
import json
import os
import signal
import statistics
import subprocess
import time

import torch
from common import set_threads
from train_workloads import Config, make_batches, spread_ids

import dynemb
from dynemb import _ops


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40, help="steady-state steps timed")
    parser.add_argument("--warm", type=int, default=5, help="first steps (inserting)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--op", choices=("dedup", "probe", "both"), default="both")
    parser.add_argument(
        "--perf", default="", help="perf arguments (e.g. 'stat -e cycles'): perf attaches "
        "to this process for the steady-state steps",
    )  # fmt: skip
    parser.add_argument("--quick", action="store_true", help="tiny sizes (smoke run)")
    args = parser.parse_args()
    set_threads(args.threads)
    config = Config(num_tables=1, warmup=args.warm, steps=args.steps)
    if args.quick:
        config = Config(num_tables=1, num_ids=10_000, batch=128, pooling_factor=4, warmup=1,
                        steps=2)  # fmt: skip
    batches = [spread_ids(b) for b in make_batches(config)]
    distinct = len(torch.unique(torch.cat(batches)))
    capacity = max(128, -(-2 * distinct // 128) * 128)
    table = dynemb.ScoredHashTable(config.dim, capacity, extra_columns=1)
    times = {"first": {"dedup": [], "probe": []}, "steady": {"dedup": [], "probe": []}}
    sizes = {"first": [], "steady": []}
    for step, keys in enumerate(batches):
        phase = "first" if step < config.warmup else "steady"
        if step == config.warmup and args.perf:
            perf = subprocess.Popen(["perf", *args.perf.split(), "-p", str(os.getpid())])
            time.sleep(1.0)  # perf attached
        start = time.thread_time()
        unique, inverse, counts = _ops.unique_keys(keys)
        mid = time.thread_time()
        inserted = 0
        if args.op != "dedup":
            _, stats = table.find_or_insert_slots(unique, counts)
            inserted = stats.inserted
        end = time.thread_time()
        times[phase]["dedup"].append(mid - start)
        times[phase]["probe"].append(end - mid)
        sizes[phase].append((keys.numel(), unique.numel(), inserted))
    if args.perf:
        perf.send_signal(signal.SIGINT)
        perf.wait()
    for phase in ("first", "steady"):
        n = statistics.median(s[0] for s in sizes[phase])
        u = statistics.median(s[1] for s in sizes[phase])
        new = statistics.median(s[2] for s in sizes[phase])
        dedup = statistics.median(times[phase]["dedup"])
        probe = statistics.median(times[phase]["probe"])
        print(json.dumps({
            "phase": phase, "keys": n, "distinct": u, "inserted": new, "threads": args.threads,
            "dedup_ms": round(dedup * 1e3, 3), "dedup_ns_per_key": round(dedup / n * 1e9, 2),
            "probe_ms": round(probe * 1e3, 3), "probe_ns_per_distinct": round(probe / u * 1e9, 2),
        }))  # fmt: skip


if __name__ == "__main__":
    main()
