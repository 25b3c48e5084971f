"""W-train through DistributedModelParallel: dynamic vs TorchRec tables, 1 and 2 processes.

Usage::

    python benchmark/bench_train_dmp.py [--quick] [--optimizer NAME] [--world-sizes 1,2]
                                        [--steps N] [--repeats N] [--workload train|wide|wide-rows]
                                        [--tables N] [--device cpu|cuda]
                                        [--sharding TYPE[,TYPE...]]
                                        [--hot-replicas K[,K...]] [--collection ebc|ec]

The step of W-train (benchmark/README.md; sizes and ids from train_workloads.py):
8 features, one table each (1,000,000 rows, dim 64), batch 4096 per process,
pooling factor 16, SUM, ``loss = sum of the pooled outputs``, fused optimizer.
Every process draws its own Zipf batches (seed ``rank``), the same for both models.
``--workload wide``: W-train-wide's step instead (64 tables of 100,000 rows, dim 16,
pooling factor 4; JSON workload ``W-train-wide-dmp``); ``--tables N`` another table
count (bench_train_wide.py sweeps it). ``--workload wide-rows``: W-wide-rows (4 tables
of 1,000,000 rows, dim 256, pooling factor 8; the column-wise workload).

- Peer (``torchrec``): TorchRec's EmbeddingBagCollection sharded by DMP with the
  FUSED kernel (fbgemm's CPU TBE): TABLE_WISE at world size 1, ROW_WISE at 2.
- dynemb (``dynemb``): the same EmbeddingBagCollection with every table dynamic,
  planned by ``DynamicEmbeddingShardingPlanner`` and sharded by
  ``DynamicEmbeddingBagCollectionSharder`` (ROW_WISE, ``roundrobin``): raw ids spread
  over 63 bits, ``num_embeddings`` = the id count, so each rank holds
  ``1,000,000 / world_size`` rows, all allocated up front (no growth while timed).

``--sharding TYPE``: every table of both models under that TorchRec sharding type
(the planner's constraint ``sharding_types=[TYPE]``; JSON metric tag ``sharding=TYPE``):
table-wise spreads whole tables over the ranks, column-wise cuts each into the
planner's column shards, table-row-wise spreads each over the ranks of one node.
``auto``: each planner picks every table's type by its cost among row-wise,
table-wise, column-wise and table-row-wise (the types it chose are printed and kept in
the JSON line's ``plan``). A comma-separated list runs each in turn, in the same run
(``--sharding row_wise,auto``: the planner's pick against all-row-wise).

World size N runs N processes (gloo on localhost), each with ``threads / N``
threads; each reports its median step time; the figure is per-process samples/s
(the slowest rank) and the aggregate (N x batch / slowest median). Each
(implementation, optimizer, world size) runs in fresh processes, interleaved
peer / dynemb, ``--repeats`` times; the figure is each one's median over the runs
(every run's figure in the JSON line's ``runs`` and ``peer_runs``). ADAM has no CPU peer.

``--workload train-skew``: W-train-skew, W-train's shape with Zipf(1.2) ids.
``--hot-replicas 0,K1,K2``: dynemb with ``DynamicEmbTableOptions.hot_replicas`` = each K
(0: none) in the same run, the peer once (K = 0); ``--collection ec``: an
EmbeddingCollection (NONE pooling, dynemb only). Each rank also counts the bytes it
sends by phase of the timed steps (``comm_bytes.py``: input dist, output dist,
backward, by collective) and the share of its ids served from the hot replicas
(``dynemb.shard.hot_key_stats``); JSON metrics ``input_bytes_per_step``,
``a2a_bytes_per_step`` (every all-to-all), ``allreduce_bytes_per_step``,
``local_share``.

``--device cuda``: rank r on ``cuda:r`` over NCCL (a world needs a GPU per rank), the
peer's FUSED kernel in HBM (ROW_WISE at 2 processes is TorchRec's own on cuda), each
step timed between two ``torch.cuda.synchronize``.
"""

import argparse
import collections
import dataclasses
import itertools
import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
from bench_train import OPTIMIZERS, has_peer
from comm_bytes import CommBytes
from common import (
    Recorder,
    add_device_argument,
    available_threads,
    commit_hash,
    median_run,
    resolve_device,
    set_threads,
)
from dmp_setup import free_port, planner_inputs
from host import record_host
from train_workloads import (
    Config,
    add_workload_arguments,
    feature_names,
    make_batches,
    spread_ids,
    summarize,
    table_names,
    time_steps,
    variant_tag,
    workload_config,
)

PEER_IMPL = "torchrec.EBC.FUSED"
DYNEMB_IMPL = "dynemb.EBC.DMP"
RESULT_PREFIX = "RESULT "
# The rates a world reports: the slowest rank's samples/s, and N x that.
RATES = ("samples_per_s", "aggregate_samples_per_s")


def _cpu_row_wise_sharder_class():
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder

    class CpuRowWiseSharder(EmbeddingBagCollectionSharder):
        """TorchRec's sharder, offering ROW_WISE and TABLE_ROW_WISE on cpu too (their
        machinery runs on gloo)."""

        def sharding_types(self, compute_device_type: str) -> list[str]:
            types = super().sharding_types(compute_device_type)
            return types + [t for t in ("row_wise", "table_row_wise") if t not in types]

    return CpuRowWiseSharder


AUTO_TYPES = ["row_wise", "table_wise", "column_wise", "table_row_wise"]


def _sharding_types(config: Config) -> list[str] | None:
    """The planner's ``sharding_types`` constraint of every table (None: none given)."""
    if config.sharding == "auto":
        return AUTO_TYPES
    return [config.sharding] if config.sharding else None


def plan_types(model) -> dict[str, str]:
    """Each table's sharding type in a DMP model's plan."""
    return {
        name: sharding.sharding_type
        for module_plan in model.plan.plan.values()
        for name, sharding in module_plan.items()
    }


def build_model(
    impl: str, config: Config, world_size: int, device: torch.device
) -> torch.nn.Module:
    import torch.distributed as dist
    from torchrec import (
        EmbeddingBagCollection,
        EmbeddingBagConfig,
        EmbeddingCollection,
        EmbeddingConfig,
    )
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.distributed.planner import EmbeddingShardingPlanner
    from torchrec.distributed.planner.types import ParameterConstraints
    from torchrec.distributed.types import ShardingEnv

    from dynemb import DynamicEmbTableOptions
    from dynemb.optimizer import EmbOptimType
    from dynemb.planner import DynamicEmbeddingShardingPlanner, DynamicEmbParameterConstraints
    from dynemb.shard import (
        DynamicEmbeddingBagCollectionSharder,
        DynamicEmbeddingCollectionSharder,
    )

    sequence = config.collection == "ec"
    config_class = EmbeddingConfig if sequence else EmbeddingBagConfig
    configs = [
        config_class(
            name=name, embedding_dim=config.dim, num_embeddings=config.num_ids, feature_names=[f]
        )
        for name, f in zip(table_names(config), feature_names(config), strict=True)
    ]
    module_class = EmbeddingCollection if sequence else EmbeddingBagCollection
    module = module_class(tables=configs, device=torch.device("meta"))
    fused = {
        "optimizer": EmbOptimType[config.optimizer],
        "learning_rate": config.learning_rate,
        "eps": config.eps,
        "beta1": config.beta1,
        "beta2": config.beta2,
    }
    planning = planner_inputs(world_size, device.type)
    if impl == "dynemb":
        sharder_class = (
            DynamicEmbeddingCollectionSharder if sequence else DynamicEmbeddingBagCollectionSharder
        )
        sharder = sharder_class(fused_params=fused)
        options = DynamicEmbTableOptions(  # init_capacity: max
            dist_type="roundrobin",
            hot_replicas=config.hot_replicas,
            hot_refresh_steps=config.hot_refresh_steps,
        )
        types = _sharding_types(config)
        constraints = {
            name: DynamicEmbParameterConstraints(
                use_dynamicemb=True, dynamicemb_options=options, sharding_types=types
            )
            for name in table_names(config)
        }
        planner = DynamicEmbeddingShardingPlanner(
            configs,
            planning["topology"],
            constraints=constraints,
            storage_reservation=planning["storage_reservation"],
        )
    else:
        sharder = _cpu_row_wise_sharder_class()(fused_params=fused)
        sharding = config.sharding or ("table_wise" if world_size == 1 else "row_wise")
        types = _sharding_types(config) or [sharding]
        constraint = ParameterConstraints(sharding_types=types, compute_kernels=["fused"])
        constraints = {name: constraint for name in table_names(config)}
        planner = EmbeddingShardingPlanner(constraints=constraints, **planning)
    plan = planner.collective_plan(module, [sharder], dist.group.WORLD)
    env = ShardingEnv.from_process_group(dist.group.WORLD)
    return DistributedModelParallel(module, env=env, plan=plan, sharders=[sharder], device=device)


def rank_inputs(impl: str, config: Config, rank: int, device: torch.device) -> list:
    """The KeyedJaggedTensor batches of ``rank`` on ``device``: its own Zipf draws (seed
    ``config.seed + rank``), ids spread over 63 bits for dynemb (raw ids for the peer)."""
    from torchrec import KeyedJaggedTensor

    batches = make_batches(dataclasses.replace(config, seed=config.seed + rank))
    if impl == "dynemb":
        batches = [spread_ids(b) for b in batches]
    lengths = torch.full((config.num_tables * config.batch,), config.pooling_factor)
    return [
        KeyedJaggedTensor(feature_names(config), b, lengths=lengths).to(device) for b in batches
    ]


def run_rank(impl: str, config: Config, rank: int, world_size: int, port: int) -> dict:
    """Trains ``impl`` as rank ``rank`` of a world meeting on localhost:``port``; the
    rank's ``summarize`` result."""
    import torch.distributed as dist

    device = torch.device("cpu")
    if config.device == "cuda":  # one GPU per rank (main checks there are enough)
        device = torch.device("cuda", rank)
        torch.cuda.set_device(device)
    dist.init_process_group(
        "nccl" if device.type == "cuda" else "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world_size,
    )
    try:
        inputs = rank_inputs(impl, config, rank, device)
        model = build_model(impl, config, world_size, device)
        comm = CommBytes()
        comm.install()
        _count_phases(model, comm)
        steps_run = [0]

        def step(kjt) -> None:
            if steps_run[0] == config.warmup:  # count the timed steps only
                comm.reset()
                _reset_hot_counts(model)
            steps_run[0] += 1
            with comm.phase("input"):  # until the output dist: the input dist's waits
                out = model(kjt)
            if config.collection == "ec":  # a JaggedTensor per feature
                loss = sum(out[f].values().sum() for f in feature_names(config))
            else:
                loss = out.values().sum()
            with comm.phase("backward"):
                loss.backward()

        desc = f"{impl} {config.optimizer} rank {rank}"
        times = time_steps(step, inputs, config.warmup, desc, device)
        dist.barrier()
        return {
            **summarize(config, times),
            "plan": plan_types(model),
            **_comm_figures(comm, model, len(times)),
        }
    finally:
        dist.destroy_process_group()


def _sharded_modules(model) -> list:
    return [m for m in model.modules() if hasattr(m, "compute_and_output_dist")]


def _count_phases(model, comm: CommBytes) -> None:
    """Counts what the sharded modules send in their output dist (and backward) apart
    from the rest of the forward (their input dist, waited before the lookup)."""
    for module in _sharded_modules(model):
        inner = module.compute_and_output_dist

        def wrapped(*args, _inner=inner, **kwargs):
            with comm.phase("output"):
                return _inner(*args, **kwargs)

        module.compute_and_output_dist = wrapped


def _reset_hot_counts(model) -> None:
    for module in model.modules():
        for hot in getattr(module, "hot_shardings", lambda: [])():
            hot.local_ids = hot.sent_ids = 0


def _comm_figures(comm: CommBytes, model, steps: int) -> dict:
    """Bytes this rank sent per timed step, by phase and collective; the share of its
    ids of tables with hot replicas served from them."""
    from dynemb.shard import hot_key_stats

    per_step = {k: v / steps for k, v in comm.by_op.items()}
    a2a = sum(v for k, v in per_step.items() if k.endswith("all_to_all"))
    stats = hot_key_stats(model)
    looked_up = stats["local_ids"] + stats["sent_ids"]
    return {
        "input_bytes_per_step": per_step.get("input.all_to_all", 0.0),
        "a2a_bytes_per_step": a2a,
        "allreduce_bytes_per_step": sum(v for k, v in per_step.items() if k.endswith("all_reduce")),
        "bytes_by_op_per_step": per_step,
        "local_share": stats["local_ids"] / looked_up if looked_up else 0.0,
        "hot_keys": stats["hot_keys"],
    }


def run_world(impl: str, config: Config, world_size: int) -> dict:
    """Runs ``world_size`` fresh processes; the slowest rank's figures. A world whose
    rank dies (seen once: a TorchRec peer rank aborted in native gloo code with
    "terminate called without an active exception") runs once more, said on stderr;
    a second death raises."""
    try:
        return _run_world_once(impl, config, world_size)
    except RuntimeError as e:
        print(f"{e}; running this world once more", file=sys.stderr)
        return _run_world_once(impl, config, world_size)


def _run_world_once(impl: str, config: Config, world_size: int) -> dict:
    port = free_port()
    script = str(Path(__file__).resolve())
    procs = []
    for rank in range(world_size):
        cmd = [sys.executable, script, "--worker", impl, "--rank", str(rank)]
        cmd += ["--world-size", str(world_size), "--port", str(port)]
        cmd += ["--config", json.dumps(dataclasses.asdict(config))]
        env = dict(os.environ, OMP_NUM_THREADS=str(config.threads))
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env))
    results = []
    for p in procs:
        out, _ = p.communicate(timeout=1800)
        if p.returncode != 0:
            for q in procs:  # the others may wait in a collective forever
                q.kill()
                q.wait()
            raise RuntimeError(f"{impl} world size {world_size}: a rank exited {p.returncode}")
        line = [ln for ln in out.splitlines() if ln.startswith(RESULT_PREFIX)][-1]
        results.append(json.loads(line[len(RESULT_PREFIX) :]))
    slowest = min(results, key=lambda r: r["samples_per_s"])
    return {
        "samples_per_s": slowest["samples_per_s"],
        "aggregate_samples_per_s": slowest["samples_per_s"] * world_size,
        "peak_rss_bytes": max(r["peak_rss_bytes"] for r in results),
        "plan": results[0]["plan"],
        # mean over the ranks of each rank's bytes sent per step; its local share
        **{key: sum(r[key] for r in results) / world_size for key in COMM_FIGURES},
        "step_ms": 1000 * config.batch / slowest["samples_per_s"],
    }


COMM_FIGURES = ("input_bytes_per_step", "a2a_bytes_per_step", "allreduce_bytes_per_step",
                "local_share")  # fmt: skip


def run_here(impl: str, config: Config, world_size: int) -> dict:
    """``run_world`` in this process: world size 1, one rank (faster start; peak RSS is
    then the process's running maximum)."""
    if world_size != 1:
        raise ValueError(f"run_here runs world size 1 only, got {world_size}")
    set_threads(config.threads)
    return run_rank(impl, config, 0, 1, free_port())


def run_pair(
    config: Config, world_size: int, repeats: int, run: Callable = run_world
) -> dict[str, dict | None]:
    """The peer and dynemb on ``config`` by ``run`` (``run_world`` or ``run_here``), one
    after the other, ``repeats`` times; each one's median run (``median_run``: the median
    per-process and aggregate rates, each run's in ``*_runs``), keyed ``"torchrec"`` and
    ``"dynemb"`` (the peer's None when fbgemm's CPU TBE lacks the optimizer)."""
    runs: dict[str, list[dict]] = {"torchrec": [], "dynemb": []}
    for _ in range(repeats):
        if has_peer(config) and config.collection == "ebc" and not config.hot_replicas:
            runs["torchrec"].append(run("torchrec", config, world_size))
        runs["dynemb"].append(run("dynemb", config, world_size))
    return {k: median_run(v, RATES) for k, v in runs.items()}


def add_world_arguments(parser: argparse.ArgumentParser, world_sizes: str) -> None:
    """Adds ``--world-sizes`` (default ``world_sizes``), ``--threads``, ``--steps``,
    ``--repeats`` and ``--device``."""
    parser.add_argument("--world-sizes", default=world_sizes, help="comma-separated process counts")
    parser.add_argument("--threads", type=int, default=available_threads(), help="in total")
    parser.add_argument("--steps", type=int, help="timed steps (default 50, quick 3)")
    parser.add_argument(
        "--repeats", type=int, default=1, help="runs per configuration; the median is reported"
    )
    add_device_argument(parser)


def world_sizes(args: argparse.Namespace, device: torch.device) -> Iterator[tuple[int, int]]:
    """``(world size, threads per process)`` of ``--world-sizes`` and ``--threads``; on
    cuda, a world size with more ranks than GPUs is skipped (said on stderr)."""
    for ws in (int(w) for w in args.world_sizes.split(",")):
        if device.type == "cuda" and ws > torch.cuda.device_count():
            gpus = torch.cuda.device_count()
            print(f"world size {ws} skipped: it needs {ws} GPUs, this machine has {gpus}",
                  file=sys.stderr)  # fmt: skip
            continue
        yield ws, max(1, args.threads // ws)


def run_worker(args: argparse.Namespace) -> None:
    """A rank's process (``--worker``): trains, prints its result as one prefixed line."""
    config = Config(**json.loads(args.config))
    set_threads(config.threads)
    result = run_rank(args.worker, config, args.rank, args.world_size, args.port)
    print(RESULT_PREFIX + json.dumps(result), flush=True)


def record(
    rec: Recorder,
    config: Config,
    ws: int,
    dyn: dict | None,
    peer: dict | None,
    baseline: dict | None = None,
) -> None:
    workload = config.workload + "-dmp"
    tag = f"@{config.optimizer}{variant_tag(config)},world_size={ws}"
    dynemb_impl = DYNEMB_IMPL if config.collection == "ebc" else "dynemb.EC.DMP"
    for impl, result, other in ((PEER_IMPL, peer, None), (dynemb_impl, dyn, peer)):
        if result is None:
            continue
        # The types a planner chose (``--sharding auto``), counted: {"table_wise": 3, ...}.
        chosen = collections.Counter(result["plan"].values()) if "plan" in result else {}
        for metric in RATES:
            rec.add(
                workload, impl, metric + tag, result[metric], threads=config.threads,
                peer=PEER_IMPL if other else None, peer_value=other[metric] if other else None,
                runs=result[metric + "_runs"], peer_runs=other[metric + "_runs"] if other else None,
                extra={"plan": dict(chosen)} if config.sharding == "auto" else None,
            )  # fmt: skip
        rec.add(
            workload, impl, "peak_rss_mib" + tag, result["peak_rss_bytes"] / 2**20,
            threads=config.threads,
        )  # fmt: skip
    if dyn is not None and "input_bytes_per_step" in dyn:
        # against dynemb without hot replicas in the same run (``base``), when given
        for metric in (*COMM_FIGURES, "step_ms"):
            base = baseline.get(metric) if baseline else None
            rec.add(
                workload, dynemb_impl, metric + tag, dyn[metric], threads=config.threads,
                peer=dynemb_impl + "@hot_replicas=0" if base is not None else None,
                peer_value=base,
            )  # fmt: skip


def sharding_list(text: str) -> list[str]:
    """``--sharding``'s comma-separated types, each checked."""
    types = text.split(",")
    for t in types:
        if t not in AUTO_TYPES + ["auto"]:
            raise argparse.ArgumentTypeError(
                f"--sharding: unknown type {t!r}; expected {', '.join(AUTO_TYPES)} or auto"
            )
    return types


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes (CI smoke run)")
    parser.add_argument("--optimizer", choices=OPTIMIZERS, help="run this optimizer only")
    add_world_arguments(parser, world_sizes="1,2")
    add_workload_arguments(parser)
    parser.add_argument(
        "--sharding", type=sharding_list, default=[None],
        help="every table of both models under this sharding type (row_wise, table_wise, "
        "column_wise, table_row_wise, or auto: the planner's pick); a comma-separated list "
        "runs each",
    )  # fmt: skip
    parser.add_argument(
        "--hot-replicas", default="0",
        help="comma-separated hot_replicas of every dynamic table (0: none), each in turn",
    )  # fmt: skip
    parser.add_argument("--hot-refresh-steps", type=int, default=20)
    parser.add_argument("--collection", choices=["ebc", "ec"], default="ebc")
    parser.add_argument("--worker", choices=["torchrec", "dynemb"], help=argparse.SUPPRESS)
    parser.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--world-size", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--config", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        run_worker(args)
        return
    device = resolve_device(args.device)
    # --quick proves the script runs: the headline optimizer only.
    optimizers = [args.optimizer] if args.optimizer else OPTIMIZERS
    if args.quick and not args.optimizer:
        optimizers = ["EXACT_ROWWISE_ADAGRAD"]
    rec = Recorder(commit_hash())
    if device.type == "cpu":
        record_host(rec, quick=args.quick)
    for ws, threads in world_sizes(args, device):
        for optimizer, sharding in itertools.product(optimizers, args.sharding):
            baseline = None
            for k in (int(x) for x in args.hot_replicas.split(",")):
                config = workload_config(
                    args, optimizer=optimizer, threads=threads, device=device.type,
                    sharding=sharding, hot_replicas=k, hot_refresh_steps=args.hot_refresh_steps,
                    collection=args.collection,
                )  # fmt: skip
                median = run_pair(config, ws, args.repeats)
                record(rec, config, ws, median["dynemb"], median["torchrec"], baseline)
                if k == 0:
                    baseline = median["dynemb"]
    print(file=sys.stderr)
    rec.print_table()
    if device.type == "cpu":
        print("ADAM: no CPU peer (fbgemm's CPU TBE has no Adam); dynemb alone.", file=sys.stderr)


if __name__ == "__main__":
    main()
