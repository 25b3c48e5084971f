"""Benchmarks the hash table alone: workloads W-table and W-scale (benchmark/README.md).

Usage::

    python benchmark/bench_table.py [--quick] [--only table|scale|hkv] [--out DIR]
                                    [--repeats N] [--device cpu|cuda]

W-table: a TIMESTAMP table of 2^22 slots (buckets of 128, dim 64 float32) is
pre-filled to load factor 0.75 with random 63-bit keys (``insert_or_assign`` in
batches of 2^20, generator seed 0), then each op runs on batches of 2^20 keys, at
one thread and at every available thread:

- ``find``: keys drawn without replacement from the keys actually resident
  after the pre-fill (a few pre-fill keys are evicted from full buckets); the
  values are gathered into the (n, 64) output the op returns.
- ``find_or_insert``: half resident keys, half new random keys, shuffled; the table
  is at its maximum capacity, so new keys landing in full buckets evict.
- ``insert_or_assign``: the same half/half batch, with given values.
- ``erase``: 2^20 resident keys.

Every op runs on the same pre-filled state every time: before each run (warm-up
included) the table's buffers are restored by copy from a snapshot taken after the
pre-fill, outside the timed region (``TableSnapshot``); ``find`` too, since at the
second thread count it follows an ``erase`` of its own keys.
This is the "fresh copy of the pre-filled table" of the workload: exact, and it
leaves every page of the table touched, as in a long-running process.

The peer is the memory roof: ``torch.index_select`` of 2^20 rows of a dense
(2^22, 64) float32 tensor by precomputed random row indices, at the same thread
count. Like ``find``, it allocates its output. Each op's runs alternate with runs
of the roof (``common.paired_median_seconds``), so load from other processes on a
shared machine hits both; the roof is also reported alone, and into a
preallocated output (``index_select(out=)``) to show what the allocation costs.
Each figure is the median of ``--repeats`` runs after one warm-up run.

W-scale: a NO_EVICTION table (dim 16, initial capacity 2^16, maximum 2^27 slots)
receives distinct keys by ``insert_or_assign`` in batches of 2^20 up to 1M, 4M,
16M and 64M keys in total (one table, cumulative). Reported per segment: insert
Mkeys/s (growth included), then at each size bytes of table memory per stored key
against the payload (8 + 4 * dim bytes) and the load factor. Growth doubles the
capacity when a key does not fit; the state after the batch preceding a doubling
gives the highest load factor reached before growth (a lower bound: the doubling
happens somewhere inside the next batch). Peak RSS of the process closes the run.

``--device cuda``: the same workloads with the tables in device memory (HBM), every
timed run between two ``torch.cuda.synchronize``, at the process's thread count only
(the host threads do not run the kernels). W-table then runs three tables: dim 64 in
HBM; dim 64 hybrid, 10% of its rows in HBM (``fast_rows``) and the rest in page-locked
host memory; and dim 8 in HBM. Beside the find figures at dim 8 and dim 64 it prints
HierarchicalKV's published A100 find figure at load factor 0.75 as an anchor
(``table_hkv.PUBLISHED_MKEYS``): published, not measured here, on other hardware.

``--only hkv`` (run only when asked): W-table at HierarchicalKV's published
configurations, 64M-slot tables at dim 8 and 64, in HBM and hybrid, at load factors
0.5, 0.75 and 1.0, beside the same peer and HierarchicalKV's published figures; meant
for ``--device cuda`` (the dim 64 table and its peer take 33 GiB), at ``--quick``
sizes anywhere. See ``table_hkv.py``.

Output: JSON lines on stdout (common.Recorder), then a table and the targets on
stderr; a PNG plot of W-scale in ``--out``.
"""

import argparse
import dataclasses
import gc
import sys
from pathlib import Path

import torch
from common import (
    Recorder,
    add_device_argument,
    available_threads,
    commit_hash,
    paired_median_seconds,
    print_rows,
    progress,
    resolve_device,
    set_threads,
)
from table_hkv import HKV_FULL, HKV_QUICK, PUBLISHED, hkv_runs, published_mkeys, run_hkv
from table_scale import plot_scale, run_scale
from table_workload import (
    BUCKET_CAPACITY,
    HYBRID_HBM_FRACTION,
    KEY_HIGH,
    ROOF,
    TableRun,
)

import dynemb

PREFILL_LOAD = 0.75


@dataclasses.dataclass(frozen=True)
class Sizes:
    """Problem sizes: benchmark/README.md defaults, or shrunk ones for --quick."""

    table_slots: int  # W-table capacity
    batch: int  # keys per batch, both workloads
    scale_init: int  # W-scale initial capacity
    scale_max: int  # W-scale maximum capacity
    scale_marks: tuple[int, ...]  # W-scale sizes at which figures are reported
    repeats: int


FULL = Sizes(2**22, 2**20, 2**16, 2**27, (2**20, 2**22, 2**24, 2**26), repeats=5)
QUICK = Sizes(2**16, 2**12, 2**10, 2**19, (2**12, 2**14, 2**16, 2**18), repeats=3)


# ------------------------------------------------------------------------------- W-table


class TableSnapshot:
    """The table's state, restored in place before each run of a mutating op
    (``ScoredHashTable.snapshot`` / ``rollback``): rebuilding it by re-insertion takes
    seconds per run and leaves pages never touched that the measured op would then
    fault in."""

    def __init__(self, table: dynemb.ScoredHashTable) -> None:
        self.table = table
        self.saved = table.snapshot()

    def restore(self) -> None:
        self.table.rollback(self.saved)


def prefill(table: dynemb.ScoredHashTable, n: int, batch: int, gen: torch.Generator) -> None:
    """Stores ``n`` random keys with random values, ``batch`` keys per insert_or_assign."""
    for start in progress(range(0, n, batch), "W-table pre-fill"):
        m = min(batch, n - start)
        keys = torch.randint(0, KEY_HIGH, (m,), generator=gen)
        rows = torch.randn(m, table.dim, generator=gen)
        table.insert_or_assign(keys.to(table.device), rows.to(table.device))


def resident_keys(table: dynemb.ScoredHashTable) -> torch.Tensor:
    """(size,) int64, on the CPU: every key the table stores."""
    keys, _, _, _ = table.export_batch(0, table.capacity())
    return keys.cpu()


def table_runs(device: torch.device) -> list[TableRun]:
    """W-table's tables: dim 64 on CPU; on cuda also hybrid and dim 8 (see module doc)."""
    if device.type == "cpu":
        return [TableRun()]
    return [TableRun(), TableRun(fast_fraction=HYBRID_HBM_FRACTION), TableRun(dim=8)]


def run_table(
    rec: Recorder,
    sizes: Sizes,
    thread_counts: list[int],
    repeats: int,
    device: torch.device,
    run: TableRun,
) -> list[str]:
    """Runs W-table for one table at each thread count; returns notes for the report."""
    gen = torch.Generator().manual_seed(0)
    dim = run.dim
    table = dynemb.ScoredHashTable(
        dim=dim,
        capacity=sizes.table_slots,
        bucket_capacity=BUCKET_CAPACITY,
        score_strategy=dynemb.DynamicEmbScoreStrategy.TIMESTAMP,
        value_dtype=torch.float32,
        device=device,
        fast_rows=run.fast_rows(sizes.table_slots),
    )
    target = int(PREFILL_LOAD * sizes.table_slots)
    prefill(table, target, sizes.batch, gen)
    resident = resident_keys(table)
    n = sizes.batch
    notes = [
        f"W-table {run.impl} dim {dim} on {device}: pre-fill of {target} keys left "
        f"{table.size()} resident (load factor {table.load_factor():.4f}, "
        f"{table.memory_usage() / 2**20:.0f} MiB)"
    ]

    def sample_resident(m: int) -> torch.Tensor:
        return resident[torch.randperm(resident.numel(), generator=gen)[:m]]

    hit_keys = sample_resident(n)
    half = torch.cat(
        [sample_resident(n // 2), torch.randint(0, KEY_HIGH, (n - n // 2,), generator=gen)]
    )
    mixed_keys = half[torch.randperm(n, generator=gen)]
    values = torch.randn(n, dim, generator=gen)
    dense = torch.randn(sizes.table_slots, dim, generator=gen)
    rows = torch.randint(0, sizes.table_slots, (n,), generator=gen)
    hit_keys, mixed_keys, values, dense, rows = (
        x.to(device) for x in (hit_keys, mixed_keys, values, dense, rows)
    )
    # Touched once: no page faults when timed.
    gathered = torch.empty(n, dim, device=device).fill_(0)
    found_rows = torch.empty(n, dim, device=device).fill_(0)
    snapshot = TableSnapshot(table)

    def gather() -> torch.Tensor:
        """The peer: benchmark/README.md's roof, a gather into a preallocated output."""
        return torch.index_select(dense, 0, rows, out=gathered)

    def gather_allocating() -> torch.Tensor:
        return torch.index_select(dense, 0, rows)

    # name -> (call, setup before each run); outputs preallocated like the roof's. find
    # restores too: it runs after the previous thread count's erase of its keys.
    ops = {
        "find": (lambda: table.find(hit_keys, out=found_rows), snapshot.restore),
        "find_or_insert": (
            lambda: table.find_or_insert(mixed_keys, out=found_rows),
            snapshot.restore,
        ),
        "insert_or_assign": (lambda: table.insert_or_assign(mixed_keys, values), snapshot.restore),
        "erase": (lambda: table.erase(hit_keys), snapshot.restore),
    }
    ops = {name: ops[name] for name in run.ops}
    notes += check_table_ops(table, snapshot, hit_keys, mixed_keys, values)

    one_thread: dict[str, float] = {}
    for threads in thread_counts:
        set_threads(threads)
        # The roof (preallocated output), and beside it the same gather allocating its
        # output: the difference is the page faults of a fresh (n, 64) tensor on this VM.
        roof_s, alloc_s = paired_median_seconds(
            gather, gather_allocating, repeats=repeats, desc=f"{ROOF} x{threads}", device=device
        )
        roof = n / roof_s / 1e6
        gather_metric = run.metric("gather_mkeys_per_s")
        rec.add("W-table", ROOF, gather_metric, roof, threads=threads)
        rec.add(
            "W-table", f"{ROOF}(allocating)", gather_metric, n / alloc_s / 1e6,
            threads=threads, peer=ROOF, peer_value=roof,
        )  # fmt: skip
        for name, (call, setup) in ops.items():
            secs, peer_secs = paired_median_seconds(
                call, gather, setup=setup, repeats=repeats, desc=f"{name} x{threads}",
                device=device,
            )  # fmt: skip
            rate = n / secs / 1e6
            metric = run.metric(f"{name}_mkeys_per_s")
            rec.add(
                "W-table", run.impl, metric, rate, threads=threads,
                peer=ROOF, peer_value=n / peer_secs / 1e6,
            )  # fmt: skip
            if threads == 1:
                one_thread[name] = rate
            elif name in one_thread:
                rec.add(
                    "W-table", run.impl, run.metric(f"{name}_thread_scaling"), rate,
                    threads=threads, peer=f"{name} at 1 thread", peer_value=one_thread[name],
                )  # fmt: skip
            if device.type == "cuda" and name == "find" and run.fast_fraction is None:
                rec.add(
                    "W-table", run.impl, f"find_mkeys_per_s@dim={dim},vs_published", rate,
                    threads=threads, peer=PUBLISHED,
                    peer_value=published_mkeys("find", dim, False, PREFILL_LOAD),
                )  # fmt: skip
    return notes


def check_table_ops(table, snapshot, hit_keys, mixed_keys, values) -> list[str]:
    """Runs each op once, untimed, and says what it did (a wrong count means a bad run)."""
    n = hit_keys.numel()
    _, found = table.find(hit_keys)
    notes = [f"W-table find: {int(found.sum())}/{n} hits"]
    for name, call in (
        ("find_or_insert", lambda: table.find_or_insert(mixed_keys)),
        ("insert_or_assign", lambda: table.insert_or_assign(mixed_keys, values)),
    ):
        snapshot.restore()
        call()
        s = table.last_stats
        notes.append(
            f"W-table {name}: hits {s.hits}, inserted {s.inserted}, evicted {s.evicted}, "
            f"failed {s.failed} (load factor after {table.load_factor():.4f})"
        )
    snapshot.restore()
    notes.append(f"W-table erase: {table.erase(hit_keys)}/{n} erased")
    snapshot.restore()
    return notes


# ------------------------------------------------------------------------------- report


def target_rows(records: list[dict]) -> list[tuple[str, ...]]:
    """Context targets (not asserted): (target, measured, met)."""

    def get(metric: str, threads: int | None = None, key: str = "value"):
        for r in records:
            if r["metric"] == metric and (threads is None or r["threads"] == threads):
                return r[key]
        return None

    rows = []

    def check(name: str, value, ok) -> None:
        if value is not None:
            rows.append((name, f"{value:.3g}", "yes" if ok(value) else "NO"))

    check("find+gather 1 thread >= 20 Mkeys/s", get("find_mkeys_per_s", 1), lambda v: v >= 20)
    check(
        "find+gather 1 thread >= 0.6x roof", get("find_mkeys_per_s", 1, "ratio"), lambda v: v >= 0.6
    )
    check(
        "find_or_insert 1 thread >= 8 Mkeys/s",
        get("find_or_insert_mkeys_per_s", 1),
        lambda v: v >= 8,
    )
    for r in records:
        if r["metric"].endswith("_thread_scaling"):
            op = r["metric"].removesuffix("_thread_scaling")
            check(f"{op} {r['threads']} threads >= 1.6x 1 thread", r["ratio"], lambda v: v >= 1.6)
    for r in records:
        if r["metric"].startswith("bytes_per_key@"):
            point = r["metric"].removeprefix("bytes_per_key@")
            lf_metric = (
                "max_load_factor_before_growth" if "growth" in point else f"load_factor@{point}"
            )
            lf = get(lf_metric)
            if lf is not None and lf >= PREFILL_LOAD:
                check(f"bytes/key @{point} <= 1.4x payload", r["ratio"], lambda v: v <= 1.4)
    return rows


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, for CI smoke runs")
    parser.add_argument(
        "--only", choices=("table", "scale", "hkv"),
        help="run one workload (hkv: only so; see table_hkv.py)",
    )  # fmt: skip
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "out", help="plot dir")
    parser.add_argument("--repeats", type=int, help="timed runs per figure (default 5, quick 3)")
    add_device_argument(parser)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    device = resolve_device(args.device)
    sizes = QUICK if args.quick else FULL
    repeats = args.repeats or sizes.repeats
    rec = Recorder(commit_hash())
    all_threads = available_threads()
    # On cuda the host threads only launch kernels: one thread count.
    thread_counts = sorted({1, all_threads}) if device.type == "cpu" else [all_threads]
    notes: list[str] = []
    if args.only in (None, "table"):
        for run in table_runs(device):
            notes += run_table(rec, sizes, thread_counts, repeats, device, run)
            gc.collect()
    if args.only == "hkv":
        set_threads(all_threads)
        for run in hkv_runs():
            notes += run_hkv(rec, HKV_QUICK if args.quick else HKV_FULL, repeats, all_threads,
                             device, run)  # fmt: skip
    if args.only in (None, "scale"):
        samples, scale_notes = run_scale(rec, sizes, all_threads, device)
        notes += scale_notes
        suffix = ("_quick" if args.quick else "") + ("_cuda" if device.type == "cuda" else "")
        plot = args.out / f"bench_table_scale{suffix}.png"
        plot_scale(samples, sizes.scale_marks, plot)
        notes.append(f"W-scale plot: {plot}")
    print(file=sys.stderr)
    rec.print_table()
    print(file=sys.stderr)
    print_rows(("target (context, not asserted)", "measured", "met"), target_rows(rec.records))
    print(file=sys.stderr)
    for note in notes:
        print(note, file=sys.stderr)


if __name__ == "__main__":
    main()
