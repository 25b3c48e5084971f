"""Process CPU time of a W-train step at full size, in all and per table or embedding op
(user and system time, page faults), for a host too busy for wall times.

The module is ``bench_train.py``'s (``build_dynemb``: 8 tables, dim 64, batch 4096,
Zipf ids, EXACT_ROWWISE_ADAGRAD, capacity ``--capacity`` times the distinct keys,
TIMESTAMP scores unless ``--score-strategy`` names another), one thread. Each op of
``dynemb._ops`` is timed by ``getrusage`` around its call. Compare two commits by
running this script (from either tree: it imports the module's package from
``PYTHONPATH``) in each, alternately, on one host.

Usage::

    PYTHONPATH=. python benchmark/count_step_cpu.py [--capacity 0.25] [--steps 10] [--pause]
                                                    [--score-strategy LFU]

``--pause``: the process stops itself (SIGSTOP) after the warm-up steps, its ids drawn
and its tables built, so that a sampling profiler sees the timed steps alone::

    PYTHONPATH=. python benchmark/count_step_cpu.py --steps 200 --pause & pid=$!
    # once it has stopped (`ps -o stat= -p $pid` shows T):
    perf record -g -p $pid -o step.data & kill -CONT $pid  # perf ends with the process

``--malloc`` (default ``fixed``): glibc's malloc thresholds fixed for the run
(``common.FIXED_MALLOC``), so that runs differ by the code, not by whether the step's
buffers come back as fresh pages; ``default`` keeps glibc's own.

Output: JSON lines on stdout (``common.Recorder``), a table on stderr.
"""

import argparse
import collections
import functools
import os
import resource
import signal
import statistics
import time

import torch
from bench_train import build_dynemb, fixed_offsets
from common import Recorder, add_malloc_argument, apply_malloc, commit_hash
from train_workloads import Config

from dynemb import DynamicEmbScoreStrategy, _ops

_WARMUP = 3


def time_ops(totals: dict) -> None:
    """Wraps every public function of ``dynemb._ops`` to add its calls, user and system
    seconds and minor page faults to ``totals[name]``."""

    def timed(name, op):
        @functools.wraps(op)
        def call(*args, **kwargs):
            before = resource.getrusage(resource.RUSAGE_SELF)
            try:
                return op(*args, **kwargs)
            finally:
                after = resource.getrusage(resource.RUSAGE_SELF)
                t = totals[name]
                t[0] += 1
                t[1] += after.ru_utime - before.ru_utime
                t[2] += after.ru_stime - before.ru_stime
                t[3] += after.ru_minflt - before.ru_minflt

        return call

    for name in dir(_ops):
        op = getattr(_ops, name)
        if not name.startswith("_") and callable(op) and not isinstance(op, type):
            setattr(_ops, name, timed(name, op))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--capacity", type=float, default=2.0, help="capacity / distinct keys")
    parser.add_argument("--steps", type=int, default=10, help="timed steps")
    parser.add_argument("--pause", action="store_true",
                        help="stop (SIGSTOP) before the timed steps, for a profiler to attach")  # fmt: skip
    parser.add_argument("--score-strategy", default="TIMESTAMP",
                        choices=[s.name for s in DynamicEmbScoreStrategy],
                        help="every table's score strategy (DECAYED_LFU: a half-life of 10 steps)")  # fmt: skip
    add_malloc_argument(parser)
    args = parser.parse_args(argv)
    if args.steps < 1:
        parser.error(f"--steps must be >= 1, got {args.steps}")
    if argv is None:  # run as a script: its own process to re-execute
        apply_malloc(args.malloc)
    torch.set_num_threads(1)
    config = Config(capacity_ratio=args.capacity, steps=args.steps, warmup=_WARMUP,
                    score_strategy=args.score_strategy)  # fmt: skip
    module, keys, _ = build_dynemb(config)
    offsets = fixed_offsets(config)
    totals = collections.defaultdict(lambda: [0, 0.0, 0.0, 0])
    time_ops(totals)
    seconds = []
    for i, indices in enumerate(keys):
        if i == _WARMUP:
            totals.clear()
            if args.pause:
                os.kill(os.getpid(), signal.SIGSTOP)
        start = time.process_time()
        module(indices, offsets).sum().backward()
        if i >= _WARMUP:
            seconds.append(time.process_time() - start)
    rec = Recorder(commit_hash())
    variant = f"capacity={args.capacity:g}x" + ("" if args.malloc == "fixed" else ",malloc=default")
    if args.score_strategy != "TIMESTAMP":
        variant += f",score_strategy={args.score_strategy}"
    impl = "dynemb.BatchedDynamicEmbeddingTables"
    rec.add(config.workload, impl, f"cpu_ms_per_step@{variant}",
            statistics.median(seconds) * 1e3, threads=1)  # fmt: skip
    for name, (calls, user, system, faults) in sorted(totals.items(), key=lambda kv: -kv[1][1]):
        if user + system < 1e-4 * args.steps:
            continue
        per_step = (("calls", calls), ("user_ms", user * 1e3), ("sys_ms", system * 1e3),
                    ("faults", faults))  # fmt: skip
        for metric, value in per_step:
            rec.add(config.workload, f"{impl}:{name}", f"{metric}_per_step@{variant}",
                    value / args.steps, threads=1)  # fmt: skip
    rec.print_table()


if __name__ == "__main__":
    main()
