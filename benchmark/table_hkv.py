"""W-table at HierarchicalKV's published configurations (bench_table.py ``--only hkv``).

Four tables of ``slots`` slots (2^26 = 64M; buckets of 128, TIMESTAMP, float32): dim 8
and dim 64, each with every row in the device's memory (HBM) and hybrid (10% of the rows
in HBM, the rest in page-locked host memory; on a CPU both tiers are RAM). The table's
metadata alone (21 bytes a slot: 1.3 GiB) is far larger than a GPU's L2 (50 MB on an
H100). Each table is pre-filled with distinct keys (``table_workload.distinct_keys``:
counters 0, 1, 2, ... mixed over 63 bits) by ``insert_or_assign`` in chunks of 2^22
keys, up to load factor 0.5, then 0.75, then 1.0 (one table, filled further each time;
1.0: chunks until every slot holds a key, full buckets evicting, at most 2x the slots
inserted: about 1.45x at 2^22 slots). At each load factor λ every op runs on batches
of 2^20 keys (HierarchicalKV's 1M keys a call):

- ``find``: 2^20 resident keys (checked resident by an untimed find); values gathered
  into a preallocated (n, dim) output;
- ``find_or_insert`` and ``insert_or_assign`` (given values): half those resident keys,
  half fresh ones (never stored before), shuffled. Each run gets new fresh keys; below
  λ 1.0 the previous run's fresh keys are erased first (untimed), so that every run
  starts at λ; at 1.0 they stay (the table stays full, each run's fresh keys evict);
- ``erase``: the 2^20 resident keys, re-inserted before each run (untimed).

Beside each op, in the same run and interleaved with it (``common.paired_median_seconds``),
the peer ``torch.index_select`` of 2^20 random rows of a dense (slots, dim) tensor in the
same memory as the table's fast tier, into a preallocated output. Each figure is the
median of ``repeats`` runs after a warm-up run. No run restores a snapshot (as W-table
does): a copy of a 64M-slot hybrid table is 16 GiB of host memory to copy back a run.

HierarchicalKV's published figures (its README: an A100 80GB PCIe, billion keys/s at λ
0.5 / 0.75 / 1.0; its hybrid table is 16 GB HBM + 16 GB host, half its rows in HBM,
not 10%) are printed beside ours as an anchor: published, not measured here, other
hardware. (On an H100 NVL its find reaches 3.9 billion keys/s at dim 8 in HBM.)

Output: JSON lines (``common.Recorder``, workload ``W-table-hkv``); metrics
``<op>_mkeys_per_s@dim=D,lf=λ`` with the peer, ``..,vs_published`` with the published
figure, ``load_factor@dim=D,lf=λ`` reached by the pre-fill.
"""

import dataclasses
import gc

import torch
from common import Recorder, paired_median_seconds, progress, synchronize
from table_workload import (
    BUCKET_CAPACITY,
    HYBRID_HBM_FRACTION,
    ROOF,
    TableRun,
    distinct_keys,
    mix63,
)

import dynemb

WORKLOAD = "W-table-hkv"
LOAD_FACTORS = (0.5, 0.75, 1.0)
FRESH_COUNTERS = 2**50  # fresh keys' counters start here: above any pre-fill's
MAX_FILL = 2.0  # λ 1.0: stop after inserting this many times the slots

# HierarchicalKV's published A100 80GB PCIe figures, in Mkeys/s at λ 0.5 / 0.75 / 1.0,
# by (dim, tier, op), from the benchmark tables of its README. Not measured here, other
# hardware: an anchor, not a peer. What was not published is absent.
PUBLISHED = "HierarchicalKV A100 (published, not measured)"
PUBLISHED_HYBRID = "HierarchicalKV A100 16GB HBM + 16GB host (published, not measured)"
PUBLISHED_MKEYS: dict[tuple[int, str, str], tuple[float, float, float]] = {
    (8, "hbm", "find"): (2470.0, 2452.0, 2481.0),
    (8, "hbm", "find_or_insert"): (1478.0, 1335.0, 612.0),
    (8, "hbm", "insert_or_assign"): (1093.0, 1045.0, 655.0),
    (64, "hbm", "find"): (1982.0, 1951.0, 2021.0),
    (64, "hbm", "find_or_insert"): (1113.0, 1033.0, 608.0),
    (64, "hbm", "insert_or_assign"): (834.0, 801.0, 621.0),
    (64, "hybrid", "find"): (124.0, 122.0, 123.0),
    (64, "hybrid", "find_or_insert"): (109.0, 111.0, 95.0),
    (64, "hybrid", "insert_or_assign"): (83.0, 83.0, 73.0),
}


def published_mkeys(op: str, dim: int, hybrid: bool, load_factor: float) -> float | None:
    """HierarchicalKV's published figure (Mkeys/s) for this op and table; None if none."""
    figures = PUBLISHED_MKEYS.get((dim, "hybrid" if hybrid else "hbm", op))
    if figures is None or load_factor not in LOAD_FACTORS:
        return None
    return figures[LOAD_FACTORS.index(load_factor)]


@dataclasses.dataclass(frozen=True)
class HkvSizes:
    """The sweep's sizes: HierarchicalKV's, or shrunk ones for --quick."""

    slots: int  # table capacity
    batch: int  # keys per timed call
    chunk: int  # keys per pre-fill call


HKV_FULL = HkvSizes(slots=2**26, batch=2**20, chunk=2**22)
HKV_QUICK = HkvSizes(slots=2**16, batch=2**12, chunk=2**14)


def hkv_runs() -> list[TableRun]:
    """The sweep's tables, those with published figures first: dim 8 and 64 with every
    row in HBM, dim 64 hybrid, then dim 8 hybrid (erase too: it costs little)."""
    hybrid = HYBRID_HBM_FRACTION
    return [TableRun(dim=8), TableRun(dim=64), TableRun(64, hybrid), TableRun(8, hybrid)]


class Prefill:
    """Fills a table with distinct keys, from counter 0 up, to ever higher load factors."""

    def __init__(self, table: dynemb.ScoredHashTable, chunk: int, gen: torch.Generator):
        self.table = table
        self.chunk = chunk
        self.inserted = 0  # counters [0, inserted) were inserted
        self.values = torch.randn(chunk, table.dim, generator=gen, device=table.device)

    def to(self, load_factor: float) -> None:
        """Inserts chunks until the table holds ``load_factor`` x its slots (1.0: until
        full, or MAX_FILL x the slots were inserted)."""
        capacity = self.table.capacity()
        target = round(load_factor * capacity)
        bar = progress(None, f"pre-fill to {load_factor}", total=target, unit="key")
        while self.table.size() < target and self.inserted < MAX_FILL * capacity:
            missing = target - self.table.size()
            m = self.chunk if target == capacity else min(self.chunk, missing)
            keys = distinct_keys(self.inserted, m, self.table.device)
            self.table.insert_or_assign(keys, self.values[:m])
            self.inserted += m
            bar.update(self.table.size() - bar.n)
        bar.close()

    def resident(self, n: int, gen: torch.Generator) -> torch.Tensor:
        """(n,) int64: distinct keys the table holds, drawn at random among those inserted.

        Raises:
            RuntimeError: fewer than ``n`` of ``2n`` drawn keys are stored.
        """
        device = self.table.device
        counters = torch.randperm(self.inserted, generator=gen, device=device)[: 2 * n]
        drawn = mix63(counters)
        _, found = self.table.find(drawn)
        held = drawn[found]
        if held.numel() < n:
            raise RuntimeError(f"only {held.numel()} of {drawn.numel()} drawn keys are stored")
        return held[:n]


class ChurnBatches:
    """find_or_insert / insert_or_assign batches: the same resident half, a fresh half
    per run (see the module doc). ``next()`` before each run (untimed), ``finish()``
    after the last; ``keys`` is the current batch."""

    def __init__(self, table, resident: torch.Tensor, counter: int, gen: torch.Generator):
        self.table = table
        self.resident = resident
        self.counter = counter  # the next fresh key's counter
        self.erase = table.load_factor() < 1.0
        n = 2 * resident.numel()
        self.order = torch.randperm(n, generator=gen, device=resident.device)
        self.fresh: torch.Tensor | None = None
        self.keys = resident

    def next(self) -> None:
        self.finish()
        n = self.resident.numel()
        self.fresh = distinct_keys(self.counter, n, self.resident.device)
        self.counter += n
        self.keys = torch.cat([self.resident, self.fresh])[self.order]

    def finish(self) -> None:
        if self.erase and self.fresh is not None:
            self.table.erase(self.fresh)
        self.fresh = None


class HkvSweep:
    """One table of the sweep, its peer's dense tensor and the ops' buffers.

    Args:
        rec: where figures go.
        sizes: the table's slots, the batch, the pre-fill chunk.
        repeats: timed runs per figure.
        threads: recorded with each figure (the caller sets them).
        device: where the table's metadata and fast tier live.
        run: the table's dim, fast tier and ops.
    """

    def __init__(self, rec, sizes: HkvSizes, repeats: int, threads: int, device, run: TableRun):
        self.rec, self.repeats, self.threads, self.device, self.run = (
            rec, repeats, threads, device, run,
        )  # fmt: skip
        self.gen = torch.Generator(device=device).manual_seed(0)
        dim, n = run.dim, sizes.batch
        self.table = dynemb.ScoredHashTable(
            dim=dim,
            capacity=sizes.slots,
            bucket_capacity=BUCKET_CAPACITY,
            score_strategy=dynemb.DynamicEmbScoreStrategy.TIMESTAMP,
            value_dtype=torch.float32,
            device=device,
            fast_rows=run.fast_rows(sizes.slots),
        )
        self.dense = torch.randn(sizes.slots, dim, generator=self.gen, device=device)
        self.rows = torch.randint(0, sizes.slots, (n,), generator=self.gen, device=device)
        # Outputs touched once: no page faults when timed.
        self.gathered = torch.zeros(n, dim, device=device)
        self.found_rows = torch.zeros(n, dim, device=device)
        self.values = torch.randn(n, dim, generator=self.gen, device=device)
        self.prefill = Prefill(self.table, sizes.chunk, self.gen)
        self.counter = FRESH_COUNTERS  # the next fresh key's counter
        self.notes: list[str] = []

    def gather(self) -> torch.Tensor:
        """The peer: a gather of as many rows as a batch, into a preallocated output."""
        return torch.index_select(self.dense, 0, self.rows, out=self.gathered)

    def at(self, load_factor: float) -> None:
        """Fills the table to ``load_factor``, then times each op there."""
        table, run = self.table, self.run
        self.prefill.to(load_factor)
        synchronize(self.device)
        tag = f"dim={run.dim},lf={load_factor}"
        self._add(f"load_factor@{tag}", table.load_factor())
        n = self.rows.numel()
        hit_keys = self.prefill.resident(n, self.gen)
        churn = ChurnBatches(table, hit_keys[: n // 2], self.counter, self.gen)
        ops = {
            "find": (lambda: table.find(hit_keys, out=self.found_rows), None),
            "erase": (
                lambda: table.erase(hit_keys),
                lambda: table.insert_or_assign(hit_keys, self.values),
            ),
            "find_or_insert": (
                lambda: table.find_or_insert(churn.keys, out=self.found_rows),
                churn.next,
            ),
            "insert_or_assign": (
                lambda: table.insert_or_assign(churn.keys, self.values),
                churn.next,
            ),
        }
        hybrid = run.fast_fraction is not None
        for name in (op for op in ops if op in run.ops):
            call, setup = ops[name]
            secs, peer_secs = paired_median_seconds(
                call, self.gather, setup=setup, repeats=self.repeats, desc=f"{name} {tag}",
                device=self.device,
            )  # fmt: skip
            rate = n / secs / 1e6
            self._add(f"{name}_mkeys_per_s@{tag}", rate, ROOF, n / peer_secs / 1e6)
            published = published_mkeys(name, run.dim, hybrid, load_factor)
            if published is not None:
                peer = PUBLISHED_HYBRID if hybrid else PUBLISHED
                self._add(f"{name}_mkeys_per_s@{tag},vs_published", rate, peer, published)
            if name == "erase":
                table.insert_or_assign(hit_keys, self.values)  # back to λ for the next op
            elif name != "find":
                s = table.last_stats
                self.notes.append(
                    f"{WORKLOAD} {run.impl} {tag} {name} (last run): hits {s.hits}, "
                    f"inserted {s.inserted}, evicted {s.evicted}, failed {s.failed}"
                )
                churn.finish()
        self.counter = churn.counter

    def close(self) -> list[str]:
        """Frees the table and the peer's tensor; returns the notes for the report."""
        table = self.table
        self.notes.append(
            f"{WORKLOAD} {self.run.impl} dim {self.run.dim} on {self.device}: "
            f"{table.capacity()} slots, {self.prefill.inserted} keys inserted in all, "
            f"load factor {table.load_factor():.4f}, {table.memory_usage() / 2**30:.2f} GiB"
        )
        del self.table, self.dense, self.prefill
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        return self.notes

    def _add(self, metric: str, value: float, peer=None, peer_value=None) -> None:
        self.rec.add(
            WORKLOAD, self.run.impl, metric, value, threads=self.threads, peer=peer,
            peer_value=peer_value,
        )  # fmt: skip


def run_hkv(
    rec: Recorder,
    sizes: HkvSizes,
    repeats: int,
    threads: int,
    device: torch.device,
    run: TableRun,
) -> list[str]:
    """The sweep over LOAD_FACTORS for one table, at ``threads`` threads (recorded; the
    caller sets them); returns notes for the report."""
    sweep = HkvSweep(rec, sizes, repeats, threads, device, run)
    for load_factor in LOAD_FACTORS:
        sweep.at(load_factor)
    return sweep.close()
