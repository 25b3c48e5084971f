"""W-scale, the growth workload of bench_table.py (benchmark/README.md): a NO_EVICTION
table receives distinct keys by ``insert_or_assign`` until it has grown to the largest
mark; reported per segment are the insert rate, bytes of table memory per key against
the payload and the load factor, and the highest load factor reached before a growth."""

import dataclasses
import gc
import time
from pathlib import Path

import torch
from common import Recorder, peak_rss_bytes, progress, set_threads, synchronize
from table_workload import BUCKET_CAPACITY, IMPL, distinct_keys

import dynemb

SCALE_DIM = 16


@dataclasses.dataclass(frozen=True)
class ScaleSample:
    """Table state after one W-scale batch."""

    size: int
    seconds: float  # time of this batch's insert_or_assign
    capacity: int
    memory: int  # bytes

    @property
    def bytes_per_key(self) -> float:
        return self.memory / self.size

    @property
    def load_factor(self) -> float:
        return self.size / self.capacity


def run_scale(
    rec: Recorder, sizes, threads: int, device: torch.device
) -> tuple[list[ScaleSample], list[str]]:
    """Runs W-scale at ``sizes`` (bench_table.Sizes: batch, scale_init, scale_max,
    scale_marks); returns the per-batch samples (for the plot) and notes."""
    set_threads(threads)
    gen = torch.Generator().manual_seed(0)
    table = dynemb.ScoredHashTable(
        dim=SCALE_DIM,
        capacity=sizes.scale_max,
        init_capacity=sizes.scale_init,
        bucket_capacity=BUCKET_CAPACITY,
        score_strategy=dynemb.DynamicEmbScoreStrategy.NO_EVICTION,
        value_dtype=torch.float32,
        device=device,
    )
    values = torch.randn(sizes.batch, SCALE_DIM, generator=gen).to(device)
    payload = 8 + 4 * SCALE_DIM
    payload_name = f"payload 8+4*{SCALE_DIM} B"
    total = sizes.scale_marks[-1]
    samples: list[ScaleSample] = []
    for start in progress(range(0, total, sizes.batch), "W-scale inserts", unit="batch"):
        keys = distinct_keys(start, min(sizes.batch, total - start), device)
        synchronize(device)
        t0 = time.perf_counter()
        stats = table.insert_or_assign(keys, values[: keys.numel()])
        synchronize(device)
        seconds = time.perf_counter() - t0
        if stats.failed or stats.hits:
            raise RuntimeError(
                f"W-scale batch at {start}: {stats.failed} failed, {stats.hits} hits"
            )
        samples.append(ScaleSample(table.size(), seconds, table.capacity(), table.memory_usage()))

    lo = 0
    for mark in sizes.scale_marks:
        seg = [s for s in samples if lo < s.size <= mark]
        rate = (mark - lo) / sum(s.seconds for s in seg) / 1e6
        at = seg[-1]
        span = f"{_count(lo)}-{_count(mark)}"
        rec.add("W-scale", IMPL, f"insert_mkeys_per_s@{span}", rate, threads=threads)
        rec.add(
            "W-scale", IMPL, f"bytes_per_key@{_count(mark)}", at.bytes_per_key, threads=threads,
            peer=payload_name, peer_value=payload,
        )  # fmt: skip
        rec.add("W-scale", IMPL, f"load_factor@{_count(mark)}", at.load_factor, threads=threads)
        lo = mark

    before_growth = [
        prev
        for prev, cur in zip(samples, samples[1:], strict=False)
        if cur.capacity > prev.capacity
    ]
    notes = [
        f"W-scale: final capacity {table.capacity()} slots, {table.size()} keys, "
        f"{len(before_growth)} growths after the first batch"
    ]
    if before_growth:
        top = max(before_growth, key=lambda s: s.load_factor)
        rec.add("W-scale", IMPL, "max_load_factor_before_growth", top.load_factor, threads=threads)
        rec.add(
            "W-scale", IMPL, "bytes_per_key@max_load_before_growth", top.bytes_per_key,
            threads=threads, peer=payload_name, peer_value=payload,
        )  # fmt: skip
        notes += [
            f"W-scale growth in the batch up to {_count(cur.size)} keys: load factor before "
            f"{prev.load_factor:.3f}, {prev.bytes_per_key:.1f} B/key, "
            f"capacity {prev.capacity} -> {cur.capacity}, that batch took {cur.seconds:.2f} s"
            for prev, cur in zip(samples, samples[1:], strict=False)
            if cur.capacity > prev.capacity
        ]
    final_memory = table.memory_usage()
    del table
    gc.collect()
    rec.add(
        "W-scale", "process", "peak_rss_bytes", peak_rss_bytes(), threads=threads,
        peer="final table.memory_usage()", peer_value=final_memory,
    )  # fmt: skip
    return samples, notes


def _count(n: int) -> str:
    """2**20 -> '1M', 2**12 -> '4K'."""
    for unit, scale in (("M", 2**20), ("K", 2**10)):
        if n and n % scale == 0:
            return f"{n // scale}{unit}"
    return str(n)


def plot_scale(samples: list[ScaleSample], marks: tuple[int, ...], path: Path) -> None:
    """Writes insert rate and bytes/key against the number of keys stored."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = [s.size for s in samples]
    batch = samples[0].size
    fig, (ax_rate, ax_mem) = plt.subplots(2, 1, sharex=True, figsize=(7, 6))
    ax_rate.plot(sizes, [batch / s.seconds / 1e6 for s in samples], lw=0.8, label="per batch")
    lo, seg_x, seg_y = 0, [], []
    for mark in marks:
        secs = sum(s.seconds for s in samples if lo < s.size <= mark)
        seg_x.append(mark)
        seg_y.append((mark - lo) / secs / 1e6)
        lo = mark
    ax_rate.plot(seg_x, seg_y, "o-", label="segment average")
    ax_rate.set_ylabel("insert Mkeys/s")
    ax_rate.legend()
    payload = 8 + 4 * SCALE_DIM
    ax_mem.plot(sizes, [s.bytes_per_key for s in samples], lw=0.8, label="table memory / key")
    ax_mem.axhline(payload, ls="--", color="gray", label=f"payload {payload} B")
    ax_mem.axhline(1.4 * payload, ls=":", color="gray", label="1.4x payload")
    ax_mem.set_ylabel("bytes per key")
    ax_mem.set_xlabel("keys stored")
    ax_mem.set_xscale("log", base=2)
    ax_mem.set_ylim(bottom=0)
    ax_mem.legend(loc="lower right")
    fig.suptitle(f"W-scale: NO_EVICTION, dim {SCALE_DIM}, batches of {batch}")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
