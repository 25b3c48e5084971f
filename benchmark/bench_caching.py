"""W-train in caching mode: a cache of 10%, 25% and 100% of the touched keys in front
of the slow tier, with and without prefetch, against all rows in one fast table.

Every configuration trains the same batches (benchmark/README.md W-train, ids spread to
63-bit keys) in this process, each right after a run of the all-in-memory peer
(BatchedDynamicEmbeddingTables without caching). Prefetch runs
dynemb.tiering.PrefetchPipeline: batch t+1's keys are fetched into the cache in a
background thread while batch t trains (overlap), or each batch's right before its
step when the step's threads already use every core (inline; ``--overlap``). Reported per
configuration: samples/s (and its ratio to the peer run just before it; medians
over the repeats) and the forward's cache hit
rate over the timed steps (with prefetch, the hit rate of the prefetches, which
are then the lookups that miss), and the keys staged (served outside a cache too
small for the batches in flight). The peer does no prefetch: with it, the table
work of the next batch overlaps the current one's, so a cached run can beat it.

``--device cuda``: the tables, batches and caches on the GPU (the caches in HBM, the
slow tiers in host memory); each step is timed after a ``torch.cuda.synchronize``.
"""

import argparse
import dataclasses
import statistics
import sys
import time

import torch
from common import (
    Recorder,
    add_device_argument,
    available_threads,
    commit_hash,
    progress,
    resolve_device,
    set_threads,
    synchronize,
)
from train_workloads import (
    QUICK,
    Config,
    fixed_offsets,
    make_batches,
    spread_ids,
)

from dynemb.tiering import PrefetchPipeline

WORKLOAD = "W-train"
PEER_IMPL = "dynemb.all_in_memory"
CACHE_FRACTIONS = (0.10, 0.25, 1.00)


@dataclasses.dataclass(frozen=True)
class Run:
    cache_fraction: float | None  # None: the all-in-memory peer
    prefetch: bool = False
    overlap: bool | None = None  # PrefetchPipeline's (None: its default for this host)

    @property
    def impl(self) -> str:
        if self.cache_fraction is None:
            return PEER_IMPL
        mode = ""
        if self.prefetch:
            overlap = PrefetchPipeline([], None, None, overlap=self.overlap).overlap
            mode = "+prefetch(overlap)" if overlap else "+prefetch(inline)"
        return f"dynemb.caching{mode}@cache={self.cache_fraction:.0%}"


def touched_keys(keys: list[torch.Tensor], config: Config) -> list[int]:
    """Distinct keys of each table over all batches."""
    per = config.batch * config.pooling_factor
    return [
        len(torch.unique(torch.cat([k[t * per : (t + 1) * per] for k in keys])))
        for t in range(config.num_tables)
    ]


def build(run: Run, touched: list[int], config: Config, device: torch.device):
    from dynemb import BatchedDynamicEmbeddingTables, DynamicEmbPoolingMode, DynamicEmbTableOptions
    from dynemb.optimizer import EmbOptimType, OptimizerConfig

    optimizer = EmbOptimType[config.optimizer]
    width = config.dim + OptimizerConfig(optimizer).state_columns(config.dim)
    options = []
    for n in touched:
        capacity = 2 * n  # no eviction in the full table (nor in the slow tier)
        o = DynamicEmbTableOptions(dim=config.dim, max_capacity=capacity, init_capacity=capacity)
        if run.cache_fraction is not None:
            o.caching = True
            o.local_hbm_for_values = int(run.cache_fraction * n) * width * 4
        options.append(o)
    return BatchedDynamicEmbeddingTables(
        options,
        feature_table_map=list(range(config.num_tables)),
        pooling_mode=DynamicEmbPoolingMode.SUM,
        optimizer=optimizer,
        learning_rate=config.learning_rate,
        device=device,
    )


def train(run: Run, module, keys: list[torch.Tensor], config: Config, device) -> dict:
    """Trains every batch; returns samples/s (median step) and the timed hit rate."""
    offsets = fixed_offsets(config).to(device)

    def step(indices: torch.Tensor) -> None:
        module(indices, offsets).sum().backward()

    def counters():
        stats = [s for s in module.cache_stats() if s is not None]
        keys_ = sum(s.prefetch_keys if run.prefetch else s.lookup_keys for s in stats)
        hits = sum(s.prefetch_hits if run.prefetch else s.lookup_hits for s in stats)
        return keys_, hits, sum(s.staged for s in stats)

    if run.prefetch:
        prefetch = lambda k: module.prefetch(k, offsets)  # noqa: E731
        steps = PrefetchPipeline(keys, step, prefetch, overlap=run.overlap)
    else:
        steps = (step(k) for k in keys)
    times, start, base = [], time.perf_counter(), None
    synchronize(device)
    for i, _ in enumerate(progress(steps, run.impl, total=len(keys), unit="step")):
        synchronize(device)
        now = time.perf_counter()
        if i == config.warmup - 1:
            base = counters()
        if i >= config.warmup:
            times.append(now - start)
        start = now
    result = {"samples_per_s": config.batch / statistics.median(times)}
    if run.cache_fraction is not None:
        end = counters()
        looked, hit = end[0] - base[0], end[1] - base[1]
        result["hit_rate"] = hit / looked if looked else 1.0
        result["staged"] = end[2] - base[2]
    return result


def measure(runs: list[Run], config: Config, repeats: int, device: torch.device) -> dict:
    """Each configuration right after its own run of the peer (the machine is shared:
    only neighbours in time see the same load); per configuration the medians over
    the repeats of its results and of its peer's samples/s."""
    keys = [spread_ids(b).to(device) for b in make_batches(config)]
    touched = touched_keys(keys, config)
    print(f"touched keys per table: {touched}", file=sys.stderr)
    results: dict[Run, list[tuple[dict, dict]]] = {run: [] for run in runs}
    for _ in range(repeats):
        for run in runs:
            pair = []
            for r in (Run(None), run):
                module = build(r, touched, config, device)
                pair.append(train(r, module, keys, config, device))
                del module
            results[run].append((pair[1], pair[0]))
    return {
        run: {
            **{k: statistics.median(r[k] for r, _ in pairs) for k in pairs[0][0]},
            "peer_samples_per_s": statistics.median(p["samples_per_s"] for _, p in pairs),
        }
        for run, pairs in results.items()
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes (CI smoke run)")
    parser.add_argument("--threads", type=int, default=available_threads())
    parser.add_argument(
        "--repeats", type=int, default=3, help="runs per configuration (medians kept)"
    )
    parser.add_argument("--steps", type=int, help="timed steps (default: 50, quick: 3)")
    parser.add_argument("--optimizer", default="EXACT_ROWWISE_ADAGRAD")
    parser.add_argument(
        "--overlap", choices=("auto", "on", "off"), default="auto",
        help="prefetch in a background thread (on), before each step (off), or as "
        "PrefetchPipeline decides for this host (auto: overlap when a core is free)",
    )  # fmt: skip
    add_device_argument(parser)
    args = parser.parse_args(argv)
    device = resolve_device(args.device)
    sizes = dict(QUICK) if args.quick else {}
    if args.steps:
        sizes["steps"] = args.steps
    set_threads(args.threads)
    config = Config(optimizer=args.optimizer, threads=args.threads, **sizes)
    overlap = {"auto": None, "on": True, "off": False}[args.overlap]
    runs = [Run(f, p, overlap if p else None) for f in CACHE_FRACTIONS for p in (False, True)]
    best = measure(runs, config, 1 if args.quick else args.repeats, device)
    rec = Recorder(commit_hash())
    opt = config.optimizer
    for run in runs:
        r = best[run]
        peer = r["peer_samples_per_s"]
        rec.add(WORKLOAD, PEER_IMPL, f"samples_per_s@{opt}", peer, threads=config.threads)
        rec.add(WORKLOAD, run.impl, f"samples_per_s@{opt}", r["samples_per_s"],
                threads=config.threads, peer=PEER_IMPL, peer_value=peer)  # fmt: skip
        rec.add(WORKLOAD, run.impl, "cache_hit_rate", r["hit_rate"], threads=config.threads)
        if r["staged"]:  # keys a fully pinned cache bucket could not take
            rec.add(WORKLOAD, run.impl, "keys_staged", r["staged"], threads=config.threads)
    print(file=sys.stderr)
    rec.print_table()


if __name__ == "__main__":
    main()
