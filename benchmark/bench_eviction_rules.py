"""The cost of eviction by rule on W-train: training steps with every table's
``EvictionRule`` at the default schedule against the same steps with no rule, in one
process (benchmark/README.md, W-train).

Usage::

    python benchmark/bench_eviction_rules.py [--quick] [--steps N] [--repeats N]
                                             [--threads N] [--every N] [--buckets N]
                                             [--idle-seconds T]

One ``BatchedDynamicEmbeddingTables`` of W-train's 8 tables (bench_train.py's
``build_dynemb``, capacity 2x the distinct keys of the run, TIMESTAMP scores) trains on
W-train's Zipf batches, cycled. The runs alternate between three settings, in an order
that rotates each repeat, so that a neighbour's burst of load hits each about equally:

- ``none``: no table has a rule (the peer);
- ``rule``: every table's ``eviction_rule`` is ``EvictionRule(max_idle_seconds=T,
  every_n_steps=N, buckets_per_step=B)`` (defaults T = 5 s, N = 100, B = 16: the
  default ``buckets_per_step``; a W-train table has ~1,560 buckets, so a pass takes
  ~98 forwards and one is under way nearly all the time: the steady cost);
- ``none,control``: no rule again, a run of its own (A/A: what the method reads where
  nothing differs).

A run is ``--steps`` steps after one warm-up step; its figures are samples per wall
second and per CPU second of the process over the whole run (one thread: the CPU time
is what the steps cost, hardly changed by neighbours). Reported: the median run of each
setting, every run, and the ``none`` runs as the peer (ratio < 1: the rule costs);
beside them the keys the rule erased and the buckets it scanned.

Output: JSON lines on stdout (``common.Recorder``), a table on stderr.
"""

import argparse
import itertools
import sys

from alternating_runs import alternating_runs, record_runs
from bench_train import build_dynemb
from common import Recorder, commit_hash, set_threads
from host import record_host
from train_workloads import QUICK, Config, fixed_offsets

from dynemb import EvictionRule

WORKLOAD = "W-train"
SETTINGS = ("none", "rule", "none,control")


def run_settings(config: Config, rule: EvictionRule, repeats: int, steps: int):
    """``(metric, setting) -> samples/s`` of each run (alternating_runs.py), and the keys
    erased and buckets scanned by the rule over all runs."""
    module, keys, _ = build_dynemb(config)

    def apply(name: str) -> None:
        for options in module.table_options:  # the options the tables read each step
            options.eviction_rule = rule if name == "rule" else None

    runs = alternating_runs(module, itertools.cycle(keys), fixed_offsets(config), config.batch,
                            SETTINGS, apply, repeats, steps)  # fmt: skip
    tel = [t.telemetry for t in module.tables]
    return runs, sum(t.rule_erased for t in tel), sum(t.rule_buckets for t in tel)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes (CI)")
    parser.add_argument("--steps", type=int, default=20, help="timed steps per run")
    parser.add_argument("--repeats", type=int, default=6, help="runs per setting")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--every", type=int, default=100, help="the rule's every_n_steps")
    parser.add_argument("--buckets", type=int, default=16, help="the rule's buckets_per_step")
    parser.add_argument("--idle-seconds", type=float, default=5.0, help="max_idle_seconds")
    args = parser.parse_args(argv)
    set_threads(args.threads)
    rec = Recorder(commit_hash())
    record_host(rec, quick=args.quick)
    sizes = dict(QUICK, warmup=0, steps=4) if args.quick else {"warmup": 0, "steps": 30}
    repeats, steps = (2, 2) if args.quick else (args.repeats, args.steps)
    every = 2 if args.quick else args.every
    rule = EvictionRule(max_idle_seconds=args.idle_seconds, every_n_steps=every,
                        buckets_per_step=args.buckets)  # fmt: skip
    config = Config(threads=args.threads, **sizes)
    runs, erased, buckets = run_settings(config, rule, repeats, steps)
    setting = f"rule=idle{args.idle_seconds:g}s,every{every},buckets{args.buckets}"
    record_runs(rec, WORKLOAD, runs, "none", "rule=none",
                lambda name: f"dynemb,{setting}" if name == "rule" else f"dynemb,rule={name}",
                args.threads)  # fmt: skip
    rec.add(WORKLOAD, f"dynemb,{setting}", "keys_erased", erased, threads=args.threads)
    rec.add(WORKLOAD, f"dynemb,{setting}", "buckets_scanned", buckets, threads=args.threads)
    print(file=sys.stderr)
    rec.print_table()


if __name__ == "__main__":
    main()
