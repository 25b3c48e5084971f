"""W-memory: what a growing NO_EVICTION table costs in memory, by its own accounting and
by the process's resident set, just before and just after each growth, and at the peak
of each growth (old and new storage alive together).

Each size runs in a fresh child process (``--child N``), so that its peak RSS (VmHWM,
reset before every batch through /proc/self/clear_refs) is the table's alone: the RSS
of the process before the table is built (torch itself) is subtracted. Reported per
size: bytes per key against the raw payload (8 B key + 4 x dim B row) just before and
just after each growth (worst of each), the highest peak RSS during a growth, and the
insert rate; ``--plot`` draws memory per key against keys inserted.

Example::

    python benchmark/bench_memory.py --quick
    python benchmark/bench_memory.py --sizes 1M 4M 16M --plot memory.png
"""

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from common import Recorder, commit_hash

DIM = 16
PAYLOAD = 8 + 4 * DIM  # bytes of one key and its float32 row
BUCKET_CAPACITY = 128
INIT_CAPACITY = 2**16
_PAGE = os.sysconf("SC_PAGE_SIZE")


def _status_bytes(field: str) -> int:
    """A ``kB`` field of /proc/self/status (VmRSS, VmHWM), in bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/self/status has no {field}")


def _reset_peak() -> bool:
    """Resets VmHWM to the current RSS (Linux >= 4.0); False where it cannot."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def child(keys_total: int, batch: int, threads: int) -> None:
    """Inserts ``keys_total`` distinct keys in batches into a fresh table, printing one
    JSON object per batch (keys, capacity, table bytes, RSS, peak RSS of the batch, both
    less the RSS before the table was built, and the batch's seconds)."""
    import torch
    from table_workload import distinct_keys

    import dynemb

    torch.set_num_threads(threads)
    values = torch.randn(batch, DIM, generator=torch.Generator().manual_seed(0))
    # Warm the op paths on a throwaway table, so their one-off allocations (code pages,
    # allocator caches) are not the table's: its inserts, and a growth in chunks.
    warm = dynemb.ScoredHashTable(
        dim=DIM, capacity=2**20, init_capacity=4096, bucket_capacity=BUCKET_CAPACITY,
        score_strategy=dynemb.DynamicEmbScoreStrategy.NO_EVICTION,
    )  # fmt: skip
    warm.insert_or_assign(distinct_keys(0, 8192), torch.zeros(8192, DIM))
    if warm.capacity() <= 4096:
        raise RuntimeError("the warm-up table did not grow")
    del warm
    base = _status_bytes("VmRSS")
    table = dynemb.ScoredHashTable(
        dim=DIM,
        capacity=max(keys_total * 2, INIT_CAPACITY),
        init_capacity=INIT_CAPACITY,
        bucket_capacity=BUCKET_CAPACITY,
        score_strategy=dynemb.DynamicEmbScoreStrategy.NO_EVICTION,
        value_dtype=torch.float32,
    )
    print(json.dumps({
        "keys": 0, "capacity": table.capacity(), "table_bytes": table.memory_usage(),
        "rss": _status_bytes("VmRSS") - base, "peak": None, "seconds": 0.0, "base": base,
    }), flush=True)  # fmt: skip
    for start in range(0, keys_total, batch):
        keys = distinct_keys(start, min(batch, keys_total - start))
        exact = _reset_peak()
        t0 = time.perf_counter()
        stats = table.insert_or_assign(keys, values[: keys.numel()])
        seconds = time.perf_counter() - t0
        if stats.failed or stats.hits:
            raise RuntimeError(f"batch at {start}: {stats.failed} failed, {stats.hits} hits")
        print(json.dumps({
            "keys": table.size(), "capacity": table.capacity(),
            "table_bytes": table.memory_usage(), "rss": _status_bytes("VmRSS") - base,
            "peak": _status_bytes("VmHWM") - base, "peak_exact": exact, "seconds": seconds,
        }), flush=True)  # fmt: skip


def run_size(keys_total: int, batch: int, threads: int) -> list[dict]:
    """The child's samples for one size."""
    out = subprocess.run(
        [sys.executable, __file__, "--child", str(keys_total), "--batch", str(batch),
         "--threads", str(threads)],
        check=True, capture_output=True, text=True, cwd=Path(__file__).parent,
    )  # fmt: skip
    return [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]


def summarize(rec: Recorder, name: str, samples: list[dict], batch: int, threads: int) -> dict:
    """Records the figures of one size; returns them."""
    growths = [
        (prev, cur)
        for prev, cur in zip(samples, samples[1:], strict=False)
        # Only growths of a table of 16 batches or more: the sample before one is then
        # within 1/16 of its load at the growth.
        if cur["capacity"] > prev["capacity"] and prev["capacity"] >= 16 * batch
    ]
    last = samples[-1]
    seconds = sum(s["seconds"] for s in samples)
    fig = {
        "keys": last["keys"],
        "growths": len(growths),
        "inserts_mkeys_per_s": last["keys"] / seconds / 1e6,
        # Just before a growth: the batch before the one that grew.
        "table_per_key_before": max((p["table_bytes"] / p["keys"] for p, _ in growths), default=0),
        "table_per_key_after": max((c["table_bytes"] / c["keys"] for _, c in growths), default=0),
        "rss_per_key_before": max((p["rss"] / p["keys"] for p, _ in growths), default=0),
        "rss_per_key_after": max((c["rss"] / c["keys"] for _, c in growths), default=0),
        "peak_per_key": max((c["peak"] / c["keys"] for _, c in growths), default=0),
        "load_before_min": min((p["keys"] / p["capacity"] for p, _ in growths), default=0),
        "load_before_max": max((p["keys"] / p["capacity"] for p, _ in growths), default=0),
        "load_after_min": min((c["keys"] / c["capacity"] for _, c in growths), default=0),
        "table_per_key_end": last["table_bytes"] / last["keys"],
        "rss_per_key_end": last["rss"] / last["keys"],
        "peak_exact": all(s.get("peak_exact", True) for s in samples),
    }
    raw = f"raw payload 8+4*{DIM} B"
    rec.add("W-memory", "dynemb", f"inserts_mkeys_per_s@{name}", fig["inserts_mkeys_per_s"],
            threads=threads)  # fmt: skip
    for metric in (
        "table_per_key_before", "table_per_key_after", "rss_per_key_before",
        "rss_per_key_after", "peak_per_key", "table_per_key_end", "rss_per_key_end",
    ):  # fmt: skip
        rec.add("W-memory", "dynemb", f"{metric}@{name}", fig[metric], threads=threads,
                peer=raw, peer_value=PAYLOAD)  # fmt: skip
    for metric in ("load_before_min", "load_before_max", "load_after_min", "growths"):
        rec.add("W-memory", "dynemb", f"{metric}@{name}", fig[metric], threads=threads)
    return fig


def plot(runs: dict[str, list[dict]], path: Path) -> None:
    """Memory per key (table accounting, RSS, peak RSS of each batch) against keys inserted."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    for i, (name, samples) in enumerate(runs.items()):
        s = [x for x in samples if x["keys"]]
        color = f"C{i}"
        x = [p["keys"] for p in s]
        ax.plot(x, [p["table_bytes"] / p["keys"] / PAYLOAD for p in s], color=color, lw=1,
                label=f"{name}: table accounting")  # fmt: skip
        ax.plot(x, [p["rss"] / p["keys"] / PAYLOAD for p in s], color=color, lw=1, ls="--",
                label=f"{name}: RSS")  # fmt: skip
        ax.plot(x, [p["peak"] / p["keys"] / PAYLOAD for p in s], color=color, lw=0,
                marker=".", ms=3, label=f"{name}: peak RSS in the batch")  # fmt: skip
    ax.axhline(1.0, color="gray", lw=0.8)
    ax.axhline(1.4, color="gray", ls=":", lw=0.8, label="1.4x raw")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("keys inserted")
    ax.set_ylabel(f"memory per key / raw payload ({PAYLOAD} B)")
    ax.set_ylim(0, 4.5)
    ax.legend(fontsize=7, ncol=2)
    ax.set_title(f"W-memory: NO_EVICTION, dim {DIM}, float32, buckets of {BUCKET_CAPACITY}")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _size(text: str) -> int:
    units = {"K": 2**10, "M": 2**20}
    return int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="256K keys (CI smoke run)")
    parser.add_argument("--sizes", nargs="+", default=["1M", "4M", "16M"],
                        help="key counts (K, M suffixes); 64M peaks near 8 GiB")  # fmt: skip
    parser.add_argument("--batch", type=int, default=2**18, help="most keys per insert")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--plot", type=Path, help="PNG of memory per key against keys")
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child is not None:
        child(args.child, args.batch, args.threads)
        return
    sizes = ["256K"] if args.quick else args.sizes
    rec = Recorder(commit=commit_hash())
    runs = {}
    for name in sizes:
        print(f"W-memory: {name} keys ...", file=sys.stderr, flush=True)
        keys = _size(name)
        batch = max(2**12, min(args.batch, keys // 64))  # 64 samples or more per size
        runs[name] = run_size(keys, batch, args.threads)
        summarize(rec, name, runs[name], batch, args.threads)
    rec.print_table()
    if args.plot:
        plot(runs, args.plot)


if __name__ == "__main__":
    main()
