"""Helpers shared by the benchmarks: records, commit, threads, device, timing, progress.

Every benchmark follows benchmark/README.md: each figure is printed as one
JSON object per line on stdout, next to the peer measured in the same run, then
a short human table goes to stderr (so stdout stays pure JSON lines).

Example::

    >>> rec = Recorder(commit=commit_hash())
    >>> rec.add("W-table", "torch.index_select", "gather_mkeys_per_s", 31.2, threads=1)
    {"workload": "W-table", "impl": "torch.index_select", "metric": ..., "peer": null, ...}
"""

import argparse
import json
import logging
import os
import resource
import statistics
import subprocess
import sys
import time
import warnings
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

REPO_ROOT = Path(__file__).resolve().parent.parent

# Known-harmless notices, silenced in every benchmark process (as in example.py):
# deprecations raised inside torch / TorchRec (e.g. TorchRec's collectives calling
# torch.distributed.all_gather_into_tensor), which a benchmark cannot act on; and
# torch.fx's once-per-process note that is_fx_tracing() also answers True under
# torch.export (TorchRec calls it on every forward; nothing here traces).
warnings.filterwarnings("ignore", category=FutureWarning, module=r"(torch|torchrec)\.")
logging.getLogger("torch.fx._symbolic_trace").setLevel(logging.ERROR)
RECORD_KEYS = (
    "workload",
    "impl",
    "metric",
    "value",
    "peer",
    "peer_value",
    "ratio",
    "threads",
    "commit",
)


def commit_hash() -> str:
    """Short hash of HEAD, suffixed ``-dirty`` when the work tree has uncommitted changes.

    Returns ``"unknown"`` outside a git checkout.
    """

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", *args], cwd=REPO_ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()

    try:
        head = git("rev-parse", "--short", "HEAD")
        dirty = bool(git("status", "--porcelain", "--untracked-files=no"))
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("-dirty" if dirty else "")


def available_threads() -> int:
    """Number of CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def set_threads(n: int) -> int:
    """Sets torch's intra-op thread count (which the dynemb CPU ops follow); returns it."""
    torch.set_num_threads(n)
    return torch.get_num_threads()


# glibc's malloc hands a freed block above its mmap threshold back to the OS at once,
# and free memory at the top of its heap above its trim threshold too; it raises both
# thresholds as blocks of up to 32 MiB are freed, unless a MALLOC_* variable fixes
# them. So whether a step's MB-sized buffers (pooled outputs, distinct keys) come back
# as fresh pages, faulted in and zeroed every step, depends on what the process freed
# before: runs of one commit then differ by up to a fifth of a CPU step. Fixed
# thresholds that keep such buffers in the heap take that chance out of a comparison.
FIXED_MALLOC = {"MALLOC_MMAP_THRESHOLD_": str(32 << 20), "MALLOC_TRIM_THRESHOLD_": str(1 << 30)}


def add_malloc_argument(parser: argparse.ArgumentParser) -> None:
    """Adds ``--malloc fixed|default`` (default fixed); apply it with ``apply_malloc``."""
    parser.add_argument(
        "--malloc", choices=("fixed", "default"), default="fixed",
        help="fixed: glibc malloc thresholds that keep a step's buffers (FIXED_MALLOC), "
        "unless a MALLOC_* variable is set; default: glibc's moving thresholds",
    )  # fmt: skip


def apply_malloc(choice: str) -> None:
    """Under ``--malloc fixed``, re-executes this process with FIXED_MALLOC in its
    environment (glibc reads it at start-up only) unless a MALLOC_* variable is set
    already, the caller's own choice; its child processes inherit it. For a script's
    entry point only: the process starts again from its command line."""
    if choice != "fixed" or any(k.startswith("MALLOC_") for k in os.environ):
        return
    os.execve(sys.executable, sys.orig_argv, {**os.environ, **FIXED_MALLOC})


def add_device_argument(parser: argparse.ArgumentParser) -> None:
    """Adds ``--device cpu|cuda`` (default cpu); read it with ``resolve_device``."""
    parser.add_argument(
        "--device", choices=("cpu", "cuda"), default="cpu",
        help="where tables and peers live (cuda: a GPU and dynemb built with DYNEMB_WITH_CUDA=1)",
    )  # fmt: skip


def resolve_device(name: str) -> torch.device:
    """The torch device of ``--device``; exits with a one-line reason when it cannot run.

    Raises:
        SystemExit: ``cuda`` asked for, but torch sees no GPU, or dynemb was built
            without its CUDA executor.
    """
    if name == "cpu":
        return torch.device("cpu")
    import dynemb

    script = Path(sys.argv[0]).name
    if not torch.cuda.is_available():
        build = "" if torch.version.cuda else "; this torch is a CPU-only build"
        sys.exit(f"{script}: --device cuda: no CUDA device (torch {torch.__version__}{build})")
    if dynemb.executor() != "cuda":  # built without CUDA, or DYNEMB_EXECUTOR names another
        sys.exit(
            f"{script}: --device cuda: dynemb's executor is {dynemb.executor()!r}, not 'cuda' "
            "(`make gpu-test` builds dynemb with DYNEMB_WITH_CUDA=1; leave DYNEMB_EXECUTOR unset)"
        )
    return torch.device("cuda", torch.cuda.current_device())


def synchronize(device: torch.device | None) -> None:
    """Waits for the GPU's queued work (timed regions on cuda); nothing on CPU."""
    if device is not None and device.type == "cuda":
        torch.cuda.synchronize(device)


def peak_rss_bytes() -> int:
    """High-water mark of this process's resident set, in bytes (Linux reports KiB)."""
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss if sys.platform == "darwin" else rss * 1024


def progress(iterable: Iterable, desc: str, total: int | None = None, unit: str = "it") -> tqdm:
    """A tqdm bar on stderr (stdout carries the JSON lines)."""
    return tqdm(iterable, desc=desc, total=total, unit=unit, file=sys.stderr, leave=False)


def median_seconds(
    fn: Callable[[], Any],
    *,
    setup: Callable[[], Any] | None = None,
    warmup: int = 1,
    repeats: int = 5,
    desc: str | None = None,
    device: torch.device | None = None,
) -> float:
    """Median wall time of ``fn()`` over ``repeats`` runs, after ``warmup`` untimed runs.

    Args:
        fn: the measured call.
        setup: called before every run (warm-up included), outside the timed region;
            e.g. restores a table that ``fn`` modifies.
        warmup: untimed runs first.
        repeats: timed runs (>= 1).
        desc: label of a progress bar; no bar when None.
        device: on cuda, each run is timed between two ``torch.cuda.synchronize``.

    Returns:
        The median of the timed runs, in seconds.
    """
    times = []
    runs = range(warmup + repeats)
    for i in progress(runs, desc) if desc else runs:
        if setup is not None:
            setup()
        synchronize(device)
        start = time.perf_counter()
        fn()
        synchronize(device)
        elapsed = time.perf_counter() - start
        if i >= warmup:
            times.append(elapsed)
    return statistics.median(times)


def paired_median_seconds(
    fn: Callable[[], Any],
    peer: Callable[[], Any],
    *,
    setup: Callable[[], Any] | None = None,
    warmup: int = 1,
    repeats: int = 5,
    desc: str | None = None,
    device: torch.device | None = None,
) -> tuple[float, float]:
    """Median wall times of ``fn()`` and of its ``peer()``, run back to back in each repeat.

    Interleaving puts the peer's runs next to the measured ones, so that a burst of
    load on a shared machine hits both and the ratio stays meaningful.

    Args:
        fn: the measured call.
        peer: the reference call.
        setup: called before every run of ``fn`` (warm-up included), untimed.
        warmup, repeats, desc, device: as in ``median_seconds``.

    Returns:
        ``(fn_seconds, peer_seconds)``, medians over the timed repeats.
    """
    times: tuple[list[float], list[float]] = ([], [])
    runs = range(warmup + repeats)
    for i in progress(runs, desc) if desc else runs:
        for call, pre, acc in ((peer, None, times[1]), (fn, setup, times[0])):
            if pre is not None:
                pre()
            synchronize(device)
            start = time.perf_counter()
            call()
            synchronize(device)
            elapsed = time.perf_counter() - start
            if i >= warmup:
                acc.append(elapsed)
    return statistics.median(times[0]), statistics.median(times[1])


def median_run(
    results: list[dict | None], rates: Iterable[str] = ("samples_per_s",)
) -> dict | None:
    """Repeated runs of one configuration as one result: for each of ``rates`` that the
    runs report, its median over the runs and its values in run order under
    ``"<rate>_runs"``; the highest ``peak_rss_bytes``. None runs (a configuration that
    did not run) are left out; None when no run is left.

    The median, not the best run: a best run flatters whichever implementation a noisy
    neighbour happened to spare, and the targets of benchmark/README.md are medians of
    interleaved runs.
    """
    done = [r for r in results if r is not None]
    if not done:
        return None
    merged = dict(done[0])
    for rate in (r for r in rates if r in merged):
        values = [r[rate] for r in done]
        merged[rate] = statistics.median(values)
        merged[rate + "_runs"] = values
    if "peak_rss_bytes" in merged:
        merged["peak_rss_bytes"] = max(r["peak_rss_bytes"] for r in done)
    return merged


class Recorder:
    """Collects benchmark records and prints each as a JSON line when added.

    Args:
        commit: recorded in every line (see ``commit_hash``).
        stream: where JSON lines go (stdout by default).
    """

    def __init__(self, commit: str, stream=None) -> None:
        self.commit = commit
        self.stream = stream if stream is not None else sys.stdout
        self.records: list[dict[str, Any]] = []

    def add(
        self,
        workload: str,
        impl: str,
        metric: str,
        value: float,
        *,
        threads: int,
        peer: str | None = None,
        peer_value: float | None = None,
        runs: list[float] | None = None,
        peer_runs: list[float] | None = None,
        extra: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Records one figure; ``ratio = value / peer_value`` when there is a peer. A
        figure that is the median of repeated runs (``median_run``) may list them all
        in ``runs`` (and the peer's in ``peer_runs``), in the order they ran; ``extra``
        adds keys of the benchmark's own (e.g. the plan it ran)."""
        ratio = value / peer_value if peer_value else None
        record = dict(
            zip(
                RECORD_KEYS,
                (workload, impl, metric, _round(value), peer, _round(peer_value),
                 _round(ratio), threads, self.commit),
                strict=True,
            )
        )  # fmt: skip
        for key, values in (("runs", runs), ("peer_runs", peer_runs)):
            if values is not None:
                record[key] = [_round(v) for v in values]
        record.update(extra or {})
        self.records.append(record)
        print(json.dumps(record), file=self.stream, flush=True)
        return record

    def print_table(self, stream=None) -> None:
        """Writes the records as an aligned text table (stderr by default)."""
        header = ("workload", "impl", "metric", "thr", "value", "peer", "peer_value", "ratio")
        rows = [
            (r["workload"], r["impl"], r["metric"], str(r["threads"]), _fmt(r["value"]),
             r["peer"] or "", _fmt(r["peer_value"]), _fmt(r["ratio"]))
            for r in self.records
        ]  # fmt: skip
        print_rows(header, rows, stream)


def print_rows(header: tuple[str, ...], rows: list[tuple[str, ...]], stream=None) -> None:
    """Prints ``rows`` under ``header`` with columns padded to their widest cell."""
    stream = stream if stream is not None else sys.stderr
    widths = [max(len(c) for c in col) for col in zip(header, *rows, strict=True)]
    for line in (header, tuple("-" * w for w in widths), *rows):
        print("  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)), file=stream)


def _round(x: float | None) -> float | None:
    return None if x is None else float(f"{x:.5g}")


def _fmt(x: float | None) -> str:
    if x is None:
        return ""
    return f"{x:.4g}" if abs(x) < 1e6 else f"{x:.3e}"
