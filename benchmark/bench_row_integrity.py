"""Does every lookup read its own key's row, and every gradient reach only it?

Usage::

    python benchmark/bench_row_integrity.py [--quick] [--steps N]

Trains one evicting table (``BatchedDynamicEmbeddingTables``, NONE pooling, EXACT_SGD,
learning rate 1, loss ``out.sum()``: every lookup moves its key's row by exactly -1
per element) on Zipf(1.05) ids and checks each step against a shadow of the
table's stored rows taken before it:

- ``foreign``: lookups that read a row that is neither the key's stored row, nor
  its initial row (a function of (seed, key)), nor the zero row of a key that
  could not be stored: another key's row;
- ``hit_reset``: lookups of a key stored before the step that read its initial
  row instead of its stored one (the key was evicted and re-inserted by its own
  batch);
- ``failed``: lookups of keys the table could not store (they read zeros);
- ``corrupted``: keys stored after the step whose row is not their row before the
  step minus their number of lookups (another key's gradient reached it, or the
  row was reset).

Workloads (one key per bag, bucket_capacity 128):

- ``zipf-lfu``: 200,000 ids, batches of 8,192 lookups, a 4,096-row table;
- ``zipf-full``: 200,000 ids, batches of 2,048 lookups, a 4,096-row table filled
  first; under TIMESTAMP, STEP and LFU;
- ``w-train-evicting``: one table of W-train at capacity 0.25x (bench_train.py):
  1,000,000 ids, batches of 4,096 x 16 = 65,536 lookups, ``ceil(0.25 x`` the distinct
  keys of the run's batches``)`` rows, 5 warm-up steps; under TIMESTAMP (W-train's
  strategy) and LFU.

Fractions are per lookup (``hit_reset``: per lookup of a stored key), over the
measured steps. No peer: the figure is a count of wrong answers, 0 is the target.
Output: JSON lines on stdout (``common.Recorder``), a table on stderr.
"""

import argparse

import torch
from common import Recorder, commit_hash, progress
from train_workloads import spread_ids, zipf_ids

import dynemb
from dynemb import (
    DynamicEmbInitializerArgs,
    DynamicEmbInitializerMode,
    DynamicEmbPoolingMode,
    DynamicEmbScoreStrategy,
    DynamicEmbTableOptions,
)
from dynemb.optimizer import EmbOptimType

WORKLOAD = "W-row-integrity"
IMPL = "dynemb"
DIM = 4
SEED = 7


def make_module(strategy: DynamicEmbScoreStrategy, capacity: int):
    options = DynamicEmbTableOptions(
        dim=DIM,
        max_capacity=capacity,
        bucket_capacity=128,
        score_strategy=strategy,
        initializer_args=DynamicEmbInitializerArgs(
            mode=DynamicEmbInitializerMode.UNIFORM, lower=-1.0, upper=1.0
        ),
        seed=SEED,
    )
    return dynemb.BatchedDynamicEmbeddingTables(
        [options],
        [0],
        pooling_mode=DynamicEmbPoolingMode.NONE,
        optimizer=EmbOptimType.EXACT_SGD,
        learning_rate=1.0,
    )


class InitialRows:
    """The initial row of any key: a function of (seed, key), read from a table
    large enough to store every key it is asked for."""

    def __init__(self, num_ids: int) -> None:
        self.module = make_module(DynamicEmbScoreStrategy.NO_EVICTION, 4 * num_ids)

    def of(self, keys: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return self.module(keys, torch.arange(keys.numel() + 1))


def stored_rows(module) -> dict[int, torch.Tensor]:
    table = module.tables[0]
    keys, values, _, _ = table.export_batch(0, table.capacity())
    return dict(zip(keys.tolist(), values.clone(), strict=True))


def distinct_keys(batch: int, num_batches: int, num_ids: int) -> int:
    """Distinct keys of run_workload's batches (the same generator and seed)."""
    gen = torch.Generator().manual_seed(0)
    ids = [zipf_ids(batch, num_ids, 1.05, gen) for _ in range(num_batches)]
    return int(torch.unique(torch.cat(ids)).numel())


def run_workload(name, strategy, capacity, batch, steps, warmup, num_ids):
    gen = torch.Generator().manual_seed(0)
    module = make_module(strategy, capacity)
    initial = InitialRows(num_ids)
    totals = dict(lookups=0, hits=0, foreign=0, hit_reset=0, failed=0, corrupted=0, stored=0)
    for step in progress(range(warmup + steps), f"{name} {strategy.name}"):
        keys = spread_ids(zipf_ids(batch, num_ids, 1.05, gen))
        before = stored_rows(module)
        init = initial.of(keys)
        out = module(keys, torch.arange(keys.numel() + 1))
        out.sum().backward()
        after = stored_rows(module)
        if step < warmup:
            continue
        counts: dict[int, int] = {}
        for k in keys.tolist():
            counts[k] = counts.get(k, 0) + 1
        for i, k in enumerate(keys.tolist()):
            row = out[i].detach()
            totals["lookups"] += 1
            if k in before:
                totals["hits"] += 1
                if torch.equal(row, before[k]):
                    continue
                if torch.equal(row, init[i]):
                    totals["hit_reset"] += 1
                else:
                    totals["foreign"] += 1
            elif torch.equal(row, init[i]):
                continue
            elif not row.any():
                totals["failed"] += 1
            else:
                totals["foreign"] += 1
        first = {}
        for i, k in enumerate(keys.tolist()):
            first.setdefault(k, i)
        for k, row in after.items():
            if k not in counts:
                continue
            totals["stored"] += 1
            start = before.get(k, init[first[k]])
            if not torch.equal(row, start - counts[k]):
                totals["corrupted"] += 1
    return totals


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes (CI smoke run)")
    parser.add_argument("--steps", type=int, help="measured steps (default 20, quick 2)")
    args = parser.parse_args(argv)
    steps = args.steps or (2 if args.quick else 20)
    scale = 16 if args.quick else 1
    torch.set_num_threads(1)
    rec = Recorder(commit_hash())
    num_ids = 200_000 // scale
    capacity = 4096 // scale
    runs = [("zipf-lfu", DynamicEmbScoreStrategy.LFU, 8192 // scale, 0)]
    runs += [
        ("zipf-full", s, 2048 // scale, 4)
        for s in (
            DynamicEmbScoreStrategy.TIMESTAMP,
            DynamicEmbScoreStrategy.STEP,
            DynamicEmbScoreStrategy.LFU,
        )
    ]
    runs = [(*run, capacity, num_ids) for run in runs]
    w_train = (4096 * 16 // scale, 5 if not args.quick else 1, 1_000_000 // scale)
    w_train_rows = -(-distinct_keys(w_train[0], steps + w_train[1], w_train[2]) // 4)
    runs += [
        ("w-train-evicting", s, w_train[0], w_train[1], w_train_rows, w_train[2])
        for s in (DynamicEmbScoreStrategy.TIMESTAMP, DynamicEmbScoreStrategy.LFU)
    ]
    for name, strategy, batch, warmup, capacity, num_ids in runs:
        totals = run_workload(name, strategy, capacity, batch, steps, warmup, num_ids)
        workload = f"{WORKLOAD}.{name}.{strategy.name}"
        lookups = totals["lookups"]
        for metric in ("foreign", "failed"):
            rec.add(workload, IMPL, f"{metric}_fraction", totals[metric] / lookups, threads=1)
        rec.add(
            workload, IMPL, "hit_reset_fraction",
            totals["hit_reset"] / max(totals["hits"], 1), threads=1,
        )  # fmt: skip
        rec.add(
            workload, IMPL, "corrupted_fraction",
            totals["corrupted"] / max(totals["stored"], 1), threads=1,
        )  # fmt: skip
        for metric in ("lookups", "hits", "foreign", "hit_reset", "failed", "corrupted"):
            rec.add(workload, IMPL, metric, totals[metric], threads=1)
    rec.print_table()


if __name__ == "__main__":
    main()
