"""The Python overhead of one training step of BatchedDynamicEmbeddingTables: Python
function calls per step (exact, whatever the host's load) and the process CPU time of
a step (one thread; far less sensitive to a busy host than wall time), on the steps of
W-train and W-train-wide at ``bench_train.py --quick`` sizes (benchmark/README.md),
where the tables are small and the Python of the module is a large part of a step.

Usage::

    PYTHONPATH=. python benchmark/count_step_overhead.py [--steps N]

Configurations: ``W-train`` (8 tables, dim 64), ``W-train-wide`` (64 tables, dim 16),
and ``W-train,cached`` (W-train's tables in caching mode, a cache of 25% of the ids).
Keys: uniform over the workload's ids, spread over the 63-bit space, the same batches
for every configuration of a run (one generator seeded 0); EXACT_ROWWISE_ADAGRAD.

There is no peer within one run: compare two commits by running the script in each,
alternately, on one host (benchmark/RESULTS.md lists such pairs). Output: JSON lines
on stdout (``common.Recorder``), a table on stderr.
"""

import argparse
import statistics
import sys
import time

import torch
from common import Recorder, commit_hash
from train_workloads import WORKLOADS, workload_sizes

from dynemb import (
    BatchedDynamicEmbeddingTables,
    DynamicEmbPoolingMode,
    DynamicEmbTableOptions,
    EmbOptimType,
)

_WARMUP = 5
_CONFIGS = (("train", False), ("wide", False), ("train", True))


def build(sizes: dict, cached: bool) -> BatchedDynamicEmbeddingTables:
    """The module of one configuration: a table per feature, capacity 2x the ids."""
    dim, ids = sizes.get("dim", 64), sizes["num_ids"]
    extra = dict(caching=True, local_hbm_for_values=ids // 4 * (dim + 1) * 4) if cached else {}
    options = [
        DynamicEmbTableOptions(dim=dim, max_capacity=2 * ids, **extra)
        for _ in range(sizes.get("num_tables", 8))
    ]
    return BatchedDynamicEmbeddingTables(
        options, feature_table_map=list(range(len(options))),
        pooling_mode=DynamicEmbPoolingMode.SUM, optimizer=EmbOptimType.EXACT_ROWWISE_ADAGRAD,
    )  # fmt: skip


def measure(sizes: dict, cached: bool, steps: int) -> tuple[int, float]:
    """``(Python calls of one step, median CPU seconds of a step)``."""
    module = build(sizes, cached)
    tables, factor = len(module.tables), sizes["pooling_factor"]
    n = tables * sizes["batch"] * factor
    generator = torch.Generator().manual_seed(0)
    offsets = torch.arange(0, n + 1, factor)
    batches = [
        (torch.randint(0, sizes["num_ids"], (n,), generator=generator) * 0x9E3779B97F4A7C15)
        & (2**63 - 1)
        for _ in range(_WARMUP + steps + 1)
    ]
    seconds = []
    for i, indices in enumerate(batches[:-1]):
        start = time.process_time()
        module(indices, offsets).sum().backward()
        if i >= _WARMUP:
            seconds.append(time.process_time() - start)
    calls = [0]

    def count(frame, event, arg):
        if event == "call":
            calls[0] += 1

    sys.setprofile(count)
    try:
        module(batches[-1], offsets).sum().backward()
    finally:
        sys.setprofile(None)
    return calls[0], statistics.median(seconds)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=60, help="timed steps per configuration")
    args = parser.parse_args(argv)
    if args.steps < 1:
        parser.error(f"--steps must be >= 1, got {args.steps}")
    torch.set_num_threads(1)
    rec = Recorder(commit_hash())
    for workload, cached in _CONFIGS:
        sizes = workload_sizes(workload, quick=True)
        name = WORKLOADS[workload]["workload"] + (",cached" if cached else "")
        calls, seconds = measure(sizes, cached, args.steps)
        impl = "dynemb.BatchedDynamicEmbeddingTables"
        rec.add(name, impl, "python_calls_per_step", calls, threads=1)
        rec.add(name, impl, "cpu_ms_per_step", seconds * 1e3, threads=1)
    rec.print_table()


if __name__ == "__main__":
    main()
