"""Publishing deltas while training: delta size and write time per 1,000
training steps on W-train, and the step-time overhead of background publication, each
beside a blocking full dump in the same run.

Usage::

    python benchmark/bench_deltas.py [--quick] [--steps N] [--every K] [--repeats N]
                                     [--threads N] [--optim] [--dir DIR]

The training step is bench_train.py's dynemb step on W-train (benchmark/README.md:
BatchedDynamicEmbeddingTables, 8 tables of dim 64, batch 4096, pooling factor 16,
Zipf ids, EXACT_ROWWISE_ADAGRAD, capacity 2x the distinct keys: no eviction). One
module is trained by five kinds of run, interleaved (none, background,
background_precapture, blocking, dump)
and repeated ``--repeats`` times, each run ``--steps`` steps over the same batches:

- ``none``: training only (no publisher: nothing tracked);
- ``background``: a DeltaPublisher (its base written before the run, untimed),
  ``publish(background=True)`` every K steps;
- ``background_precapture``: the same with ``DeltaPublisher(precapture=True)`` (the
  writer thread reads most of each delta between deltas: dynemb/deltas/precapture.py);
- ``blocking``: the same with ``publish()`` (the step waits for the write);
- ``dump``: a blocking full ``DynamicEmbDump`` every K steps (the peer).

Figures (medians over the repeats): step time (a run's wall time over its steps:
publishing steps included, and the wait for the writes still pending at its end, so
that the publication's whole cost is in it) and its ratio to ``none``, also over the
second half of each run alone (``second_half_step_s``: a new publisher's first deltas
fill its reused buffers; the drain counted); bytes written and write seconds per
1,000 steps (a run's totals scaled by
1,000 / steps; a background delta's write time is measured on the writer thread) for
deltas against the full dump; the capture time of a delta (on the training thread).
Publications happen at steps K/2, 3K/2, ..., so that a background write overlaps the
following steps; the time ``close`` still waits after the last step (``drain_s``, also
reported) is in the step time. Before the timed runs the module trains once over all
the batches (every key is stored: no run pays for first insertions). The defaults
(runs of 300 steps, scaled to 1,000) are said in every JSON line's metric name
(``steps=...``).

Threads: training runs on ``--threads`` torch threads (default 1: on a small shared
machine one thread is far less sensitive to neighbours, and the writer thread gets the
other core); the writer thread runs at nice 19 (dynemb/deltas/background.py).

Output: JSON lines on stdout (``common.Recorder``), a table on stderr.
"""

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from common import Recorder, available_threads, commit_hash, progress, set_threads
from train_workloads import Config, fixed_offsets, make_batches, spread_ids, workload_sizes

from dynemb import (
    BatchedDynamicEmbeddingTables,
    DynamicEmbDump,
    DynamicEmbPoolingMode,
    DynamicEmbTableOptions,
)
from dynemb.deltas import DeltaPublisher
from dynemb.optimizer import EmbOptimType

KINDS = ("none", "background", "background_precapture", "blocking", "dump")
PUBLISHING = ("background", "background_precapture", "blocking")
IMPL = {
    "none": "train",
    "background": "DeltaPublisher.publish(background=True)",
    "background_precapture": "DeltaPublisher(precapture=True).publish(background=True)",
    "blocking": "DeltaPublisher.publish()",
    "dump": "DynamicEmbDump",
}
PEER = "dump"


def dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def where(times: list, every: int, after: int = 10) -> str:
    """Where a run's time goes (a diagnostic): the mean step at a publication, in the
    ``after`` steps that follow one, and elsewhere."""
    at, following, other = [], [], []
    for i, t in enumerate(times, 1):
        since = (i - every // 2) % every  # 0 at a publication step
        (at if since == 0 else following if since <= after else other).append(t)
    mean = lambda xs: sum(xs) / len(xs) if xs else float("nan")  # noqa: E731
    return (
        f"mean step at a publication {mean(at):.4f} s, in the {after} after {mean(following):.4f}"
        f" s, elsewhere {mean(other):.4f} s"
    )


def build(config: Config, keys: list[torch.Tensor]) -> BatchedDynamicEmbeddingTables:
    per_feature = config.batch * config.pooling_factor
    options = []
    for t in range(config.num_tables):
        distinct = len(
            torch.unique(torch.cat([k[t * per_feature : (t + 1) * per_feature] for k in keys]))
        )
        capacity = int(-(-config.capacity_ratio * distinct // 1))
        options.append(
            DynamicEmbTableOptions(dim=config.dim, max_capacity=capacity, init_capacity=capacity)
        )
    return BatchedDynamicEmbeddingTables(
        table_options=options,
        feature_table_map=list(range(config.num_tables)),
        pooling_mode=DynamicEmbPoolingMode.SUM,
        optimizer=EmbOptimType[config.optimizer],
        learning_rate=config.learning_rate,
        eps=config.eps,
        table_names=[f"t{i}" for i in range(config.num_tables)],
    )


def run(kind: str, module, keys, offsets, every: int, optim: bool, scratch: Path) -> dict:
    """One run of ``kind`` over ``keys``; its step times and publication figures."""
    directory = scratch / kind
    shutil.rmtree(directory, ignore_errors=True)
    publisher = None
    if kind in PUBLISHING:
        precapture = kind == "background_precapture"
        publisher = DeltaPublisher(module, directory, optim=optim, precapture=precapture)
        publisher.publish_base()  # untimed: the chain's start, a full dump
    times, bytes_, write_s, capture_s, publications = [], 0, 0.0, 0.0, 0
    for i, k in enumerate(progress(keys, kind, unit="step"), 1):
        start = time.perf_counter()
        module(k, offsets).sum().backward()
        publishing = i % every == every // 2
        if publishing and kind == "dump":
            t = time.perf_counter()
            DynamicEmbDump(directory, module, optim=optim, allow_overwrite=True)
            write_s += time.perf_counter() - t
        elif publishing and publisher is not None:
            publisher.publish(background=kind.startswith("background"))
        times.append(time.perf_counter() - start)
        publications += publishing
        if publishing and kind == "dump":  # the dump just written (older ones are removed)
            bytes_ += dir_bytes(directory)
    drain = 0.0
    if publisher is not None:
        start = time.perf_counter()
        publisher.close()
        drain = time.perf_counter() - start
    # The writes still pending when the steps end count: the run is over once they are.
    # The second half alone too: a publisher's first deltas fill its buffers.
    late = times[len(times) // 2 :]
    result = {
        "step_s": (sum(times) + drain) / len(times),
        "second_half_step_s": (sum(late) + drain) / len(late),
        "drain_s": drain,
    }
    print(f"{kind}: step_s {result['step_s']:.4f} drain_s {drain:.2f}; {where(times, every)}",
          file=sys.stderr)  # fmt: skip
    if publisher is not None:
        commits = [c for c in publisher.commits if c.version >= 1]
        assert len(commits) == publications, (len(commits), publications)
        bytes_ = sum(dir_bytes(c.path) for c in commits)
        write_s = sum(c.write_seconds for c in commits)
        capture_s = sum(c.capture_seconds for c in commits)
        print(
            f"{kind}: capture_s per delta {[round(c.capture_seconds, 3) for c in commits]}, "
            f"write_s {[round(c.write_seconds, 3) for c in commits]}, entries read before "
            f"the boundary {[c.entries_before for c in commits]} and at it "
            f"{[c.entries_at_boundary for c in commits]}",
            file=sys.stderr,
        )
    shutil.rmtree(directory, ignore_errors=True)
    scale = 1000 / len(keys)
    result.update(
        bytes_per_1000=bytes_ * scale,
        write_s_per_1000=write_s * scale,
        capture_s_per_1000=capture_s * scale,
        per_publication_bytes=bytes_ / max(publications, 1),
        per_publication_write_s=write_s / max(publications, 1),
    )
    return result


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes (CI smoke run)")
    parser.add_argument("--steps", type=int, default=300, help="steps per run (quick: 4)")
    parser.add_argument("--every", type=int, default=100, help="publish every K steps (quick: 2)")
    parser.add_argument("--repeats", type=int, default=3, help="interleaved runs of each kind")
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help=f"torch threads (this machine: {available_threads()})",
    )
    parser.add_argument("--optim", action="store_true", help="publish optimizer state too")
    parser.add_argument(
        "--kinds",
        default=",".join(KINDS),
        help=f"comma-separated kinds to run (default all: {','.join(KINDS)}; none always runs)",
    )
    parser.add_argument("--dir", help="where to write (default: a temporary directory)")
    return parser.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    kinds = [k for k in KINDS if k == "none" or k in args.kinds.split(",")]
    unknown = set(args.kinds.split(",")) - set(KINDS)
    if unknown:
        raise SystemExit(f"--kinds: unknown {sorted(unknown)}, expected some of {list(KINDS)}")
    if args.quick:
        args.steps, args.every, args.repeats = 4, 2, 1
    threads = set_threads(args.threads)
    config = Config(**{**workload_sizes("train", args.quick), "warmup": 2, "steps": args.steps})
    keys = [spread_ids(b) for b in make_batches(config)]
    module = build(config, keys)
    offsets = fixed_offsets(config)
    warmup, keys = keys[: config.warmup], keys[config.warmup :]
    for k in progress(warmup + keys, "warm-up (every key stored)", unit="step"):
        module(k, offsets).sum().backward()
    scratch = Path(tempfile.mkdtemp(prefix="bench_deltas-", dir=args.dir))
    results = {kind: [] for kind in kinds}
    try:
        for _ in range(args.repeats):
            for kind in kinds:
                results[kind].append(
                    run(kind, module, keys, offsets, args.every, args.optim, scratch)
                )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

    def median(kind: str, field: str) -> float:
        return statistics.median(r[field] for r in results[kind])

    rec = Recorder(commit_hash())
    tag = f"@K={args.every},steps={args.steps}{',optim' if args.optim else ''}"
    base = median("none", "step_s")
    workload = config.workload + (",quick" if args.quick else "")
    rec.add(workload, IMPL["none"], "step_s" + tag, base, threads=threads)
    publishing = [k for k in PUBLISHING if k in kinds]
    for kind in (*publishing, "dump"):
        if kind not in kinds:
            continue
        rec.add(workload, IMPL[kind], "step_s" + tag, median(kind, "step_s"), threads=threads,
                peer=IMPL["none"], peer_value=base)  # fmt: skip
    late = median("none", "second_half_step_s")
    for kind in publishing:
        rec.add(workload, IMPL[kind], "second_half_step_s" + tag,
                median(kind, "second_half_step_s"), threads=threads, peer=IMPL["none"],
                peer_value=late)  # fmt: skip
    for field in (
        "bytes_per_1000",
        "write_s_per_1000",
        "per_publication_bytes",
        "per_publication_write_s",
    ):
        if PEER not in kinds:
            break
        peer = median(PEER, field)
        for kind in publishing:
            rec.add(workload, IMPL[kind], field + tag, median(kind, field), threads=threads,
                    peer=IMPL[PEER], peer_value=peer)  # fmt: skip
    for kind in publishing:
        rec.add(
            workload,
            IMPL[kind],
            "capture_s_per_1000" + tag,
            median(kind, "capture_s_per_1000"),
            threads=threads,
        )
        rec.add(workload, IMPL[kind], "drain_s" + tag, median(kind, "drain_s"), threads=threads)
    rec.print_table()


if __name__ == "__main__":
    main()
