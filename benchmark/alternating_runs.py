"""Training runs of one module that alternate between settings, and their record.

A benchmark of what a setting costs a training step (table telemetry, an eviction rule)
runs the same module under each setting in turn, in an order that rotates each repeat,
so that a neighbour's burst of load hits each about equally; one setting is the peer,
and a second run of the peer's setting under another name (an A/A control) shows what
the method reads where nothing differs.
"""

import statistics
import sys
import time
from collections.abc import Callable, Iterator, Sequence

import torch
from common import Recorder, synchronize

Runs = dict[tuple[str, str], list[float]]


def alternating_runs(
    module: torch.nn.Module,
    batches: Iterator[torch.Tensor],
    offsets: torch.Tensor,
    batch_size: int,
    settings: Sequence[str],
    apply: Callable[[str], None],
    repeats: int,
    steps: int,
    label: str = "",
) -> Runs:
    """``(metric, setting) -> samples/s`` of each run, in the order they ran. A run applies
    its setting (``apply(name)``), takes one warm-up step, then times ``steps`` steps
    (forward, backward): samples per wall second (``samples_per_s``: a mean over the
    run, so that a sampled step's cost counts) and per CPU second of the process
    (``samples_per_cpu_s``: with one thread, what the steps cost, hardly changed by
    neighbours that take the core away)."""
    runs: Runs = {}
    names = list(settings)
    for r in range(repeats):
        for name in names[r % len(names) :] + names[: r % len(names)]:  # rotated order
            apply(name)
            module(next(batches), offsets).sum().backward()  # warm-up
            synchronize(None)
            start, cpu = time.perf_counter(), time.process_time()
            for _ in range(steps):
                module(next(batches), offsets).sum().backward()
            synchronize(None)
            wall = batch_size * steps / (time.perf_counter() - start)
            per_cpu = batch_size * steps / (time.process_time() - cpu)
            runs.setdefault(("samples_per_s", name), []).append(wall)
            runs.setdefault(("samples_per_cpu_s", name), []).append(per_cpu)
            print(f"  {label}{name}: {wall:.0f} samples/s, {per_cpu:.0f} per CPU s",
                  file=sys.stderr)  # fmt: skip
    return runs


def record_runs(
    rec: Recorder,
    workload: str,
    runs: Runs,
    peer_setting: str,
    peer_name: str,
    impl: Callable[[str], str],
    threads: int,
    suffix: str = "",
) -> None:
    """One row per (metric, setting): the median run, every run, and beside each setting
    but the peer's the peer's median and runs (ratio < 1: the setting costs)."""
    for (metric, name), values in runs.items():
        peer_runs = runs[(metric, peer_setting)]
        peer = None if name == peer_setting else peer_name
        rec.add(workload, impl(name), f"{metric}{suffix}", statistics.median(values),
                threads=threads, peer=peer,
                peer_value=None if peer is None else statistics.median(peer_runs),
                runs=values, peer_runs=None if peer is None else peer_runs)  # fmt: skip
