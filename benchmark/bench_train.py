"""Benchmarks one training step of embedding tables: workload W-train (benchmark/README.md).

Usage::

    python benchmark/bench_train.py [--quick] [--optimizer NAME] [--only torchrec|dynemb]
                                    [--threads N] [--steps N] [--repeats N] [--in-process]
                                    [--workload train|wide] [--tables N] [--device cpu|cuda]

The step: 8 sparse features, one table each (1,000,000 rows, dim 64), batch 4096,
pooling factor 16 (fixed lengths), SUM pooling, ``loss = sum of the pooled outputs``,
backward with the optimizer fused into it (learning rate 0.01, eps 1e-8). Ids follow
Zipf(s=1.05) over the 1,000,000 ids of each table, drawn by inverse-CDF sampling from
one generator seeded 0 (``zipf_ids``); every step gets a fresh batch, all batches
being drawn before any timing (so both implementations see exactly the same ids).
``--workload wide`` runs W-train-wide's step instead (64 tables of 100,000 rows, dim 16,
pooling factor 4), ``--tables N`` another table count; sizes, ids and timing live in
``train_workloads.py``.

- Peer (``run_torchrec``): TorchRec ``EmbeddingBagCollection`` built on the meta
  device, sharded by ``DistributedModelParallel`` at world size 1 (one gloo process
  group, initialised in-process on a free localhost port) TABLE_WISE with the FUSED
  compute kernel, i.e. fbgemm's CPU TBE. The planner is restricted to that kernel by
  ``ParameterConstraints`` (its CPU estimators reject the uvm kernels). The optimizer
  goes through the sharder's fused params as an fbgemm ``EmbOptimType`` (what
  ``apply_optimizer_in_backward``, deprecated in TorchRec 1.8, would be converted
  to); the built TBE is checked to carry it. Optimizers: EXACT_ROWWISE_ADAGRAD,
  EXACT_SGD, EXACT_ADAGRAD. fbgemm's CPU TBE has no Adam: for ADAM only dynemb runs.
- dynemb (``run_dynemb``): ``dynemb.BatchedDynamicEmbeddingTables`` over the same 8
  tables, keys spread over the 63-bit space as ``(id * 0x9E3779B97F4A7C15) & (2^63 - 1)``,
  capacity ``2 x`` the distinct keys of each table in the run (no eviction), then a
  variant at ``0.25 x`` (eviction on the hot path). Skipped (peer figures only) while
  dynemb does not provide the module.

Each figure: ``samples_per_s = batch / median step time`` over the timed steps (after
warm-up steps), and the peak RSS of the process (it includes the pre-drawn batches,
the same for both implementations). Every (implementation, optimizer, capacity) runs
in its own subprocess (``--worker``), so that peak RSS is per configuration and no
state leaks from one to the next; ``--in-process`` runs all in this process instead
(faster start, but RSS is then a running maximum). ``--quick`` shrinks the sizes
(CI smoke run, in-process, well under 30 s).

Noise: both implementations run parallel loops on every thread; when another
process holds a core of a 2-core machine, each parallel region waits for a
descheduled thread and a whole run can be 10-20x slower (not 2x). ``--repeats N``
repeats the sequence peer, dynemb (interleaved) and reports each configuration's median
run (every run's figure in the JSON line's ``runs``); ``--threads 1`` is far less
sensitive to such neighbours.

``--device cuda``: tables, peers and batches on the GPU (DMP over a one-rank NCCL group),
each step timed between two ``torch.cuda.synchronize``. The peer is then fbgemm's GPU TBE
(FUSED, every row in HBM), which has Adam. Two tiered configurations follow, with the
same HBM budget per table, 10% of the peer's rows (``GPU_HBM_FRACTION``): dynemb hybrid
(``local_hbm_for_values``, the other rows in host memory) and dynemb caching
(``caching=True``), both against TorchRec's FUSED_UVM_CACHING kernel with
``cache_load_factor`` 0.1.

Output: JSON lines on stdout (``common.Recorder``), a table on stderr.
"""

import argparse
import dataclasses
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import torch
from common import (
    Recorder,
    add_device_argument,
    add_malloc_argument,
    apply_malloc,
    available_threads,
    commit_hash,
    median_run,
    resolve_device,
    set_threads,
)
from host import record_host
from train_peer import PEER_OPTIMIZERS, has_peer, peer_impl, run_torchrec
from train_workloads import (
    Config,
    add_workload_arguments,
    fixed_offsets,
    make_batches,
    spread_ids,
    summarize,
    time_steps,
    variant_tag,
    workload_config,
)

GPU_HBM_FRACTION = 0.1  # --device cuda: tiered tables' HBM, as a fraction of the peer's rows
DYNEMB_IMPL = "dynemb.BatchedDynamicEmbeddingTables"
OPTIMIZERS = (*PEER_OPTIMIZERS, "ADAM")
DYNEMB_ONLY_OPTIMIZERS = ("FTRL",)  # run when named by --optimizer
CAPACITY_RATIOS = (2.0, 0.25)  # dynemb: no eviction, then eviction on the hot path
RESULT_PREFIX = "RESULT "


# --- dynemb: the extension point ---------------------------------------------------------


def dynemb_capacities(keys: list[torch.Tensor], config: Config) -> list[int]:
    """Per table: ``ceil(capacity_ratio * distinct keys over all batches)``."""
    per_feature = config.batch * config.pooling_factor
    capacities = []
    for t in range(config.num_tables):
        table_keys = torch.cat([k[t * per_feature : (t + 1) * per_feature] for k in keys])
        distinct = len(torch.unique(table_keys))
        capacities.append(int(-(-config.capacity_ratio * distinct // 1)))
    return capacities


def build_dynemb(config: Config) -> tuple[torch.nn.Module, list[torch.Tensor], list[int]]:
    """``dynemb.BatchedDynamicEmbeddingTables`` for ``config`` and its batches' keys.

    Same batches as the peer, each id spread to a 63-bit key (``spread_ids``); one
    table per feature of ``ceil(capacity_ratio * distinct keys)`` rows, allocated up
    front (``init_capacity = max_capacity``) so that no growth happens while timed.
    With ``hbm_fraction``, each table's fast tier (or cache, with ``caching``) holds
    ``hbm_fraction * num_ids`` rows with their optimizer state: the HBM of the peer's cache.

    Returns:
        The module, the keys of each batch (on ``config.device``) and the capacities.
    """
    from dynemb import (
        BatchedDynamicEmbeddingTables,
        DynamicEmbPoolingMode,
        DynamicEmbScoreStrategy,
        DynamicEmbTableOptions,
    )
    from dynemb.optimizer import OptimizerConfig, optimizer_type_of

    device = torch.device(config.device)
    keys = [spread_ids(b).to(device) for b in make_batches(config)]
    capacities = dynemb_capacities(keys, config)
    scores = {"score_strategy": getattr(DynamicEmbScoreStrategy, config.score_strategy)}
    if config.score_strategy == "DECAYED_LFU":
        scores["score_half_life_steps"] = config.score_half_life_steps
    tiers = {}
    if config.hbm_fraction is not None:
        optimizer = optimizer_type_of(config.optimizer)
        width = config.dim + OptimizerConfig(optimizer).state_columns(config.dim)
        rows = int(config.hbm_fraction * config.num_ids)
        tiers = {"local_hbm_for_values": rows * width * 4, "caching": config.caching}
    module = BatchedDynamicEmbeddingTables(
        table_options=[
            DynamicEmbTableOptions(
                dim=config.dim,
                max_capacity=c,
                init_capacity=c,
                embedding_dtype=getattr(torch, config.embedding_dtype),
                stochastic_rounding=config.stochastic_rounding,
                **scores,
                **tiers,
            )  # fmt: skip
            for c in capacities
        ],
        feature_table_map=list(range(config.num_tables)),
        pooling_mode=DynamicEmbPoolingMode.SUM,
        optimizer=optimizer_type_of(config.optimizer),
        learning_rate=config.learning_rate,
        eps=config.eps,
        beta1=config.beta1,
        beta2=config.beta2,
        weight_decay=0.0,
        device=device,
    )
    return module, keys, capacities


def run_dynemb(config: Config) -> dict:
    """Trains ``build_dynemb``'s module like the peer: ``loss = sum of the pooled outputs``."""
    module, keys, capacities = build_dynemb(config)
    device = torch.device(config.device)
    offsets = fixed_offsets(config).to(device)

    def step(indices: torch.Tensor) -> None:
        module(indices, offsets).sum().backward()

    times = time_steps(step, keys, config.warmup, f"dynemb {config.optimizer}", device)
    return summarize(config, times, capacities=capacities)


# --- running configurations --------------------------------------------------------------

RUNNERS = {"torchrec": run_torchrec, "dynemb": run_dynemb}


def run_worker(impl: str, config: Config) -> None:
    """Subprocess entry: runs one configuration, prints its result as one prefixed line."""
    set_threads(config.threads)
    result = RUNNERS[impl](config)
    print(RESULT_PREFIX + json.dumps(result), flush=True)


def run_isolated(impl: str, config: Config) -> dict | None:
    """Runs ``impl`` on ``config`` in a fresh interpreter (per-configuration peak RSS)."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", impl]
    cmd += ["--config", json.dumps(dataclasses.asdict(config))]
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, check=True)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(RESULT_PREFIX)]
    return json.loads(lines[-1][len(RESULT_PREFIX) :])


def run_in_process(impl: str, config: Config) -> dict | None:
    set_threads(config.threads)
    return RUNNERS[impl](config)


def record_peer(rec: Recorder, config: Config, peer: dict) -> None:
    for metric, value, runs in metrics(config, peer):
        rec.add(config.workload, peer_impl(config), metric, value, threads=config.threads,
                runs=runs)  # fmt: skip


def dynemb_variant(config: Config) -> str:
    """The metric suffix of a dynemb configuration ('' for the headline one)."""
    suffix = "" if config.capacity_ratio == 2.0 else f",capacity={config.capacity_ratio:g}x"
    if config.hbm_fraction is not None:
        mode = "caching" if config.caching else "hybrid"
        suffix += f",{mode}={config.hbm_fraction:.0%}HBM"
    if config.embedding_dtype != "float32":
        suffix += f",{config.embedding_dtype}" + ("+sr" if config.stochastic_rounding else "")
    return suffix


def record_dynemb(rec: Recorder, config: Config, dyn: dict, peer: dict | None) -> None:
    peer_metrics = {m[0]: m for m in metrics(config, peer)} if peer else {}
    for metric, value, runs in metrics(config, dyn):
        _, peer_value, peer_runs = peer_metrics.get(metric, (None, None, None))
        rec.add(
            config.workload,
            DYNEMB_IMPL,
            metric + dynemb_variant(config),
            value,
            threads=config.threads,
            peer=peer_impl(config) if peer else None,
            peer_value=peer_value,
            runs=runs,
            peer_runs=peer_runs,
        )


def metrics(config: Config, result: dict) -> list[tuple[str, float, list[float] | None]]:
    """``(metric, value, each run's value or None)`` of a (median) result."""
    opt = config.optimizer + variant_tag(config)
    return [
        (f"samples_per_s@{opt}", result["samples_per_s"], result.get("samples_per_s_runs")),
        (f"peak_rss_mib@{opt}", result["peak_rss_bytes"] / 2**20, None),
    ]


def run_optimizer(
    rec: Recorder,
    base: Config,
    run: Callable,
    *,
    with_peer: bool,
    with_dynemb: bool,
    repeats: int = 1,
    variants_only: bool = False,
) -> None:
    """The peer, then dynemb at each capacity ratio, for ``base.optimizer``; on cuda
    also the tiered peer (FUSED_UVM_CACHING), then dynemb hybrid and caching.

    With ``repeats > 1`` the whole sequence is repeated (so the peer's runs stay
    interleaved with dynemb's) and each configuration reports its median run.
    """
    peers = [base]
    variants = [dataclasses.replace(base, capacity_ratio=r) for r in CAPACITY_RATIOS]
    if variants_only:  # bench_quality.py --variants' set: FTRL, then bfloat16 rows rounded
        variants = [base, dataclasses.replace(base, optimizer="FTRL")] + [  # to nearest, then
            dataclasses.replace(base, embedding_dtype="bfloat16", stochastic_rounding=sr)
            for sr in (False, True)  # stochastically
        ]
    if base.device == "cuda":
        tiered = dataclasses.replace(base, hbm_fraction=GPU_HBM_FRACTION)
        peers.append(tiered)
        variants += [tiered, dataclasses.replace(tiered, caching=True)]
    configs: list[tuple[str, Config]] = []
    if with_peer:
        configs += [("torchrec", c) for c in peers if has_peer(c)]
    if with_dynemb:
        configs += [("dynemb", c) for c in variants]
    results: list[list[dict | None]] = [[] for _ in configs]
    for _ in range(repeats):
        for (impl, config), acc in zip(configs, results, strict=True):
            acc.append(run(impl, config))
    peers_by_hbm: dict[float | None, dict] = {}  # the peers come first in ``configs``
    for (impl, config), acc in zip(configs, results, strict=True):
        result = median_run(acc)
        if result is None:
            continue
        if impl == "torchrec":
            peers_by_hbm[config.hbm_fraction] = result
            record_peer(rec, config, result)
        else:
            record_dynemb(rec, config, result, peers_by_hbm.get(config.hbm_fraction))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes (CI smoke run)")
    parser.add_argument(
        "--optimizer",
        choices=(*OPTIMIZERS, *DYNEMB_ONLY_OPTIMIZERS),
        help="run this optimizer only (FTRL: dynemb alone, fbgemm has no FTRL kernel)",
    )
    parser.add_argument(
        "--variants",
        action="store_true",
        help="dynemb at capacity 2x: the optimizer with float32 rows, FTRL, then bfloat16 rows "
        "rounded to nearest and stochastically (stochastic_rounding), interleaved",
    )
    parser.add_argument("--only", choices=sorted(RUNNERS), help="run this implementation only")
    parser.add_argument("--threads", type=int, default=available_threads())
    parser.add_argument(
        "--repeats", type=int, default=1, help="runs per configuration; the median is reported"
    )
    parser.add_argument("--steps", type=int, help="timed steps (default: 50, quick: 3)")
    add_workload_arguments(parser)
    parser.add_argument("--in-process", action="store_true", help="no subprocess per configuration")
    parser.add_argument("--worker", choices=sorted(RUNNERS), help=argparse.SUPPRESS)
    parser.add_argument("--config", help=argparse.SUPPRESS)
    add_device_argument(parser)
    add_malloc_argument(parser)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.worker:  # the parent's allocator settings are in its environment
        run_worker(args.worker, Config(**json.loads(args.config)))
        return
    if argv is None:  # run as a script: its own process to re-execute
        apply_malloc(args.malloc)
    device = resolve_device(args.device)
    run = run_in_process if args.in_process or args.quick else run_isolated
    with_dynemb = args.only != "torchrec"
    rec = Recorder(commit_hash())
    if device.type == "cpu":
        record_host(rec, quick=args.quick)
    for optimizer in (args.optimizer,) if args.optimizer else OPTIMIZERS:
        config = workload_config(
            args, optimizer=optimizer, threads=args.threads, device=device.type
        )
        run_optimizer(
            rec,
            config,
            run,
            with_peer=args.only != "dynemb",
            with_dynemb=with_dynemb,
            repeats=args.repeats,
            variants_only=args.variants,
        )
    print(file=sys.stderr)
    rec.print_table()
    if args.only != "torchrec" and not with_dynemb:
        print(f"\n{DYNEMB_IMPL} not available yet: peer figures only.", file=sys.stderr)
    if device.type == "cpu":
        print("ADAM: no CPU peer (fbgemm's CPU TBE has no Adam); dynemb alone.", file=sys.stderr)


if __name__ == "__main__":
    main()
