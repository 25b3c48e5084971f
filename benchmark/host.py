"""What the host of a run can do: a few one-thread probes, recorded beside the figures.

Same-run ratios compare two implementations on one host, but hosts of one machine kind
differ, and not by one factor: TorchRec's fused CPU backward of a W-train step has taken
19.9 ms on one 2-vCPU host and 133 ms on another of the same kind (a nested micro-VM),
while dynemb's took 22.7 and 65.5 ms. These probes say which kind of host a line of
figures came from:

- ``random_row_gather_ns``: ``index_select`` of random 256-byte rows from a 2 GiB table
  (W-train's TorchRec tables: 8 x 1,000,000 x 256 bytes), far beyond any cache: memory
  latency and address translation, as in a lookup;
- ``cached_row_gather_ns``: the same from a 4 MiB table (the core and its caches);
- ``python_loop_ns``: one iteration of a plain Python loop (interpreter speed).

They run in a child process (``python host.py [--quick]`` prints them as JSON), so the
2 GiB table never counts in a benchmark's peak RSS.

Example::

    >>> rec = Recorder(commit_hash())
    >>> record_host(rec)  # three JSON lines, workload "host", impl the CPU's model name
"""

import argparse
import json
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
from common import Recorder

ROW_FLOATS = 64  # 256-byte rows, W-train's embedding
LARGE_TABLE_ROWS = 8 * 2**20  # 2 GiB
SMALL_TABLE_ROWS = 2**14  # 4 MiB
GATHERED_ROWS = 2**18
LOOP_ITERATIONS = 10**6


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo), or what ``platform`` says."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _median_ns(fn: Callable[[], None], per: int, repeats: int = 3) -> float:
    fn()  # warm: pages touched, caches filled
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1e9 * statistics.median(times) / per


def gather_ns(table_rows: int, gathered: int = GATHERED_ROWS) -> float:
    """ns per row of ``index_select`` of ``gathered`` random rows of a table of
    ``table_rows`` 256-byte rows, one thread."""
    table = torch.ones(table_rows, ROW_FLOATS)
    index = torch.randint(0, table_rows, (gathered,), generator=torch.Generator().manual_seed(0))
    out = torch.empty(gathered, ROW_FLOATS)
    return _median_ns(lambda: torch.index_select(table, 0, index, out=out), gathered)


def python_loop_ns(iterations: int = LOOP_ITERATIONS) -> float:
    def loop() -> None:
        total = 0
        for i in range(iterations):
            total += i

    return _median_ns(loop, iterations)


def host_probes(quick: bool = False) -> dict[str, float]:
    """The probes above, on one thread (the caller's thread count is restored);
    ``quick``: a 64 MiB large table (CI smoke runs)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        large = LARGE_TABLE_ROWS // 32 if quick else LARGE_TABLE_ROWS
        return {
            "random_row_gather_ns": gather_ns(large),
            "cached_row_gather_ns": gather_ns(SMALL_TABLE_ROWS),
            "python_loop_ns": python_loop_ns(),
        }
    finally:
        torch.set_num_threads(threads)


def record_host(rec: Recorder, quick: bool = False) -> None:
    """Records ``host_probes``, run in a child process, as JSON lines: workload
    ``"host"``, impl the CPU's model name."""
    command = [sys.executable, str(Path(__file__).resolve())] + (["--quick"] if quick else [])
    probes = json.loads(subprocess.run(command, check=True, capture_output=True, text=True).stdout)
    model = cpu_model()
    for metric, value in probes.items():
        rec.add("host", model, metric, value, threads=1)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="Prints host_probes as one JSON object.")
    parser.add_argument("--quick", action="store_true", help="a 64 MiB large table")
    print(json.dumps(host_probes(parser.parse_args().quick)))
