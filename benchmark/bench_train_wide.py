"""W-train-wide's table sweep: step time vs number of tables, dynemb vs TorchRec through DMP.

Usage::

    python benchmark/bench_train_wide.py [--quick] [--sweep 8,32,64,128] [--optimizer NAME]
                                         [--world-sizes 1] [--steps N] [--repeats N]
                                         [--plot PATH] [--device cpu|cuda]

Each point is W-train-wide's step (benchmark/README.md; train_workloads.py: one
table per feature of 100,000 ids, dim 16, pooling factor 4, batch 4096, Zipf(s=1.05))
with N tables, trained through DistributedModelParallel exactly as bench_train_dmp.py
trains it (its ``run_world``: fresh processes per point, the TorchRec peer FUSED and
TABLE_WISE at world size 1, dynemb ROW_WISE), peer and dynemb one after the other,
``--repeats`` times, the median run kept. The headline of W-train-wide (64 tables, every
optimizer, 1 and 2 processes) is ``bench_train_dmp.py --workload wide``.

Reported: at each point, each one's median step time in ms (dynemb's ratio to the peer
> 1 means slower); then each one's growth of the step time with the tables, the slope
of a least-squares line through the points (ms per table), dynemb's beside the peer's:
benchmark/README.md asks that a step's cost grow no faster with the tables than the peer's.
The plot (step time vs tables, both implementations) goes to
``benchmark/out/train_wide_tables.png`` or ``--plot``.

``--quick``: 2 and 8 tables at --quick sizes, world size 1 in this process (CI smoke run,
seconds). Noise: as bench_train.py says, a neighbour on a 2-core machine can slow a
whole run many times over; ``--repeats`` reports the median of several.

Output: JSON lines on stdout (``common.Recorder``), a table on stderr.
"""

import argparse
import sys
from pathlib import Path

import numpy as np
from bench_train import OPTIMIZERS
from bench_train_dmp import (
    DYNEMB_IMPL,
    PEER_IMPL,
    add_world_arguments,
    run_here,
    run_pair,
    run_world,
    world_sizes,
)
from common import REPO_ROOT, Recorder, commit_hash, resolve_device
from host import record_host
from train_workloads import workload_config

WORKLOAD = "W-train-wide"
SWEEP = "8,32,64,128"  # tables, benchmark/README.md
QUICK_SWEEP = "2,8"
DEFAULT_PLOT = REPO_ROOT / "benchmark" / "out" / "train_wide_tables.png"
IMPLS = {"torchrec": PEER_IMPL, "dynemb": DYNEMB_IMPL}


def sweep(args: argparse.Namespace, rec: Recorder) -> dict[str, list[tuple[int, float]]]:
    """Runs every (world size, tables) point; returns ``{line label: [(tables, step ms)]}``
    and records each point and each implementation's slope."""
    device = resolve_device(args.device)
    tables = [int(n) for n in (args.sweep or (QUICK_SWEEP if args.quick else SWEEP)).split(",")]
    run = run_here if args.quick else run_world
    lines: dict[str, list[tuple[int, float]]] = {}
    for ws, threads in world_sizes(args, device):
        if run is run_here and ws != 1:
            print(f"--quick: world size {ws} skipped (in-process runs are world size 1)",
                  file=sys.stderr)  # fmt: skip
            continue
        points: dict[str, list[tuple[int, float]]] = {"torchrec": [], "dynemb": []}
        for n in tables:
            config = workload_config(
                args, optimizer=args.optimizer, threads=threads, device=device.type, num_tables=n
            )
            median = run_pair(config, ws, args.repeats, run)
            tag = f"@{config.optimizer},tables={n},world_size={ws}"
            peer_ms = step_ms(config.batch, median["torchrec"])
            for impl, result in median.items():
                if result is None:
                    continue
                ms = step_ms(config.batch, result)
                points[impl].append((n, ms))
                rec.add(
                    WORKLOAD, IMPLS[impl], "step_ms" + tag, ms, threads=threads,
                    peer=PEER_IMPL if impl == "dynemb" and peer_ms else None,
                    peer_value=peer_ms if impl == "dynemb" else None,
                    runs=run_step_ms(config.batch, result),
                    peer_runs=run_step_ms(config.batch, median["torchrec"]) if impl == "dynemb" else None,
                )  # fmt: skip
        record_slopes(rec, points, f"@{args.optimizer},world_size={ws}", threads)
        for impl, pts in points.items():
            if pts:
                lines[IMPLS[impl] + (f", world size {ws}" if ws > 1 else "")] = pts
    return lines


def step_ms(batch: int, result: dict | None) -> float | None:
    """The step time (ms) of a result's ``samples_per_s`` (its slowest rank's; for a
    median result, the median run's)."""
    return None if result is None else 1e3 * batch / result["samples_per_s"]


def run_step_ms(batch: int, result: dict | None) -> list[float] | None:
    """Each run's step time (ms) of a median result, in run order."""
    return None if result is None else [1e3 * batch / r for r in result["samples_per_s_runs"]]


def record_slopes(
    rec: Recorder, points: dict[str, list[tuple[int, float]]], tag: str, threads: int
) -> None:
    """Records ``step_ms_per_table``: each implementation's least-squares slope of step
    time over tables (needs two points or more), dynemb's beside the peer's."""
    slopes = {}
    for impl, pts in points.items():
        if len(pts) >= 2:
            x, y = np.array(pts, dtype=np.float64).T
            slopes[impl] = float(np.polyfit(x, y, 1)[0])
    for impl, slope in slopes.items():
        peer = slopes.get("torchrec") if impl == "dynemb" else None
        rec.add(
            WORKLOAD, IMPLS[impl], "step_ms_per_table" + tag, slope, threads=threads,
            peer=PEER_IMPL if peer else None, peer_value=peer,
        )  # fmt: skip


def plot(lines: dict[str, list[tuple[int, float]]], path: Path, title: str) -> None:
    """Writes step time vs tables, one line per implementation (and world size), as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for label, pts in lines.items():
        x, y = zip(*pts, strict=True)
        ax.plot(x, y, marker="o", label=label)
    ticks = sorted({n for pts in lines.values() for n, _ in pts})
    ax.set_xticks(ticks)
    ax.set_xlabel("tables (one feature each)")
    ax.set_ylabel("median step time (ms)")
    ax.set_ylim(bottom=0)
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes, in-process (CI)")
    parser.add_argument("--optimizer", choices=OPTIMIZERS, default="EXACT_ROWWISE_ADAGRAD")
    parser.add_argument("--sweep", help=f"comma-separated table counts (default {SWEEP})")
    parser.add_argument("--plot", type=Path, default=DEFAULT_PLOT, help="where the PNG goes")
    add_world_arguments(parser, world_sizes="1")
    parser.set_defaults(workload="wide", tables=None)  # workload_config's; --sweep sets tables
    args = parser.parse_args(argv)
    rec = Recorder(commit_hash())
    if args.device == "cpu":
        record_host(rec, quick=args.quick)
    lines = sweep(args, rec)
    print(file=sys.stderr)
    rec.print_table()
    sizes = "--quick sizes" if args.quick else "dim 16, pooling factor 4, batch 4096"
    title = f"{WORKLOAD}: {sizes}, {args.optimizer}\n{args.threads} thread(s) per world, commit {rec.commit}"
    plot(lines, args.plot, title)
    print(f"plot: {args.plot}", file=sys.stderr)


if __name__ == "__main__":
    main()
