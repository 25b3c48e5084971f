"""The cost of table telemetry on W-train: training steps with it on against the same
steps with it off, in one process (benchmark/README.md, W-train).

Usage::

    python benchmark/bench_telemetry.py [--quick] [--capacity-ratios 2,0.25] [--steps N]
                                        [--repeats N] [--threads N] [--optimizer NAME]

One ``BatchedDynamicEmbeddingTables`` of W-train's 8 tables (bench_train.py's
``build_dynemb``: capacity ``ratio x`` the distinct keys of the run; at 0.25x every
step evicts) trains on W-train's Zipf batches, cycled. The runs alternate between
four settings of every table's ``TableTelemetry``, in an order that rotates each
repeat, so that a neighbour's burst of load hits each about equally:

- ``off``: ``enabled=False`` (the peer: nothing counted);
- ``on``: the defaults (every step counted, evictions sampled every 100 steps);
- ``on,sample_every=1``: every step's evictions sampled (the worst case).
- ``off,control``: off again, a run of its own: its ratio to ``off`` is what the
  method reads where nothing differs (an A/A comparison).

A run is ``--steps`` steps after one warm-up step; its figures are samples/s over the
run's whole wall time (a mean, not a median of steps: a sampled step's cost counts),
``samples_per_s``, and over the CPU time the process spent in it, ``samples_per_cpu_s``
(one thread: what the step cost, hardly changed by neighbours that take the core
away, which wall time is not on a shared 2-core machine). Reported per capacity and
setting: the median run, every run (``runs``), and beside the ``on`` settings the
``off`` runs as the peer (ratio < 1: telemetry costs).

Before the runs, the cost of the counting itself: ``TableTelemetry``'s two hooks of a
batch upsert (``before_upsert``, ``after_upsert``) on a step that is not sampled, timed
alone (``telemetry_hooks_us_per_table_step``, the median of 5 batches of 10,000 calls on
a W-train table's status tensor); a step calls them once per table.

Output: JSON lines on stdout (``common.Recorder``), a table on stderr.
"""

import argparse
import dataclasses
import itertools
import statistics
import sys
import time

import torch
from alternating_runs import Runs, alternating_runs, record_runs
from bench_train import OPTIMIZERS, build_dynemb
from common import Recorder, commit_hash, set_threads
from host import record_host
from train_workloads import QUICK, Config, fixed_offsets

WORKLOAD = "W-train"
SETTINGS = {
    "off": {"enabled": False},
    "off,control": {"enabled": False},  # off again: the method's own scatter (A/A)
    "on": {"enabled": True, "sample_every": 100},
    "on,sample_every=1": {"enabled": True, "sample_every": 1},
}


def run_settings(config: Config, repeats: int, steps: int) -> Runs:
    """``(metric, setting) -> samples/s`` of each run (alternating_runs.py)."""
    module, keys, _ = build_dynemb(config)
    tables = list(module.telemetry().values())

    def apply(name: str) -> None:
        for telemetry in tables:
            telemetry.configure(**SETTINGS[name])

    return alternating_runs(module, itertools.cycle(keys), fixed_offsets(config), config.batch,
                            list(SETTINGS), apply, repeats, steps,
                            label=f"{config.capacity_ratio:g}x ")  # fmt: skip


def hook_microseconds(config: Config, calls: int = 10_000) -> float:
    """Median over 5 batches of the microseconds of one unsampled step's two hooks."""
    module, keys, _ = build_dynemb(dataclasses.replace(config, steps=1))
    offsets = fixed_offsets(config)
    module(keys[0], offsets).sum().backward()  # a real lookup: the table holds its keys
    table = module.tables[0]
    telemetry = table.telemetry
    telemetry.configure(sample_every=0)
    distinct = torch.unique(keys[0][: config.batch * config.pooling_factor])
    slots = table.find_slots(distinct)
    status = torch.zeros_like(distinct, dtype=torch.int8)
    counts = [distinct.numel(), 0, 0, 0]
    times = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(calls):
            telemetry.before_upsert(1)
            telemetry.after_upsert(status, distinct, counts, slots)
        times.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes (CI)")
    parser.add_argument("--capacity-ratios", default="2,0.25", help="comma-separated")
    parser.add_argument("--steps", type=int, default=20, help="timed steps per run")
    parser.add_argument("--repeats", type=int, default=5, help="runs per setting")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--optimizer", choices=OPTIMIZERS, default="EXACT_ROWWISE_ADAGRAD")
    args = parser.parse_args(argv)
    set_threads(args.threads)
    rec = Recorder(commit_hash())
    record_host(rec, quick=args.quick)
    # The batches drawn (cycled by the runs): W-train's first 30, or --quick's 4.
    sizes = dict(QUICK, warmup=0, steps=4) if args.quick else {"warmup": 0, "steps": 30}
    repeats, steps = (2, 2) if args.quick else (args.repeats, args.steps)
    hooks = hook_microseconds(Config(optimizer=args.optimizer, threads=args.threads, **sizes))
    rec.add(WORKLOAD, "dynemb,telemetry=on", "telemetry_hooks_us_per_table_step", hooks,
            threads=args.threads)  # fmt: skip
    for ratio in (float(r) for r in args.capacity_ratios.split(",")):
        config = Config(optimizer=args.optimizer, capacity_ratio=ratio, threads=args.threads,
                        **sizes)  # fmt: skip
        runs = run_settings(config, repeats, steps)
        suffix = "" if ratio == 2.0 else f",capacity={ratio:g}x"
        record_runs(rec, WORKLOAD, runs, "off", "telemetry=off", lambda name: f"dynemb,telemetry={name}",
                    args.threads, suffix)  # fmt: skip
    print(file=sys.stderr)
    rec.print_table()


if __name__ == "__main__":
    main()
