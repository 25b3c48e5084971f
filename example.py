"""dynemb example: a DLRM with dynamic embedding tables, trained on synthetic clicks.

Usage::

    torchrun --nproc_per_node=2 example.py --train --eval            # dynamic tables
    torchrun --nproc_per_node=2 example.py --train --eval --static   # TorchRec tables only
    python example.py --train --eval                                 # one process
    torchrun --nproc_per_node=2 example.py --train --eval --caching --prefetch  # caching mode
    torchrun --nproc_per_node=2 example.py --train --dump            # then, at any world size:
    python example.py --load --eval                                  # the same held-out AUC
    torchrun --nproc_per_node=2 example.py --train --eval --publish_every 100  # base + deltas
    python examples/serve.py                                         # served: the same AUC

The model (``dynemb.models.SequenceDLRM``): a dense MLP, an EmbeddingBagCollection
of 7 pooled features, an EmbeddingCollection of 1 sequence feature (its rows
mean-pooled per sample), pairwise dot products and an over MLP. By default 6 pooled
tables and the sequence table are dynamic (``dynemb``: raw 63-bit ids, rows
inserted on first sight, sharded ROW_WISE with ``--dist_type``) and 1 pooled table
is an ordinary TorchRec table (ids are row indices in ``[0, vocab_size)``; dynamic
too with ``--optimizer ADAM`` on CPU, where fbgemm has no Adam); ``--static`` makes
every table an ordinary one (TABLE_WISE, FUSED kernel), as a peer. The data is ``dynemb.datasets.SyntheticClicks`` (W-quality's generator), of
which the default run uses half (``--num_train``: the first 500k of W-quality's 1M
training rows, all 100k held-out rows) so that it finishes in well under a minute
on 2 CPU cores (3 minutes at most on a busy machine).

The code follows NVIDIA DynamicEmb's example: tables on the meta device, a
constraint per table, the planner's plan, ``DistributedModelParallel`` with the
dynamic sharders, the embedding optimizer in the sharders' ``fused_params`` and a
torch optimizer over the dense parameters. Runs on CPU with gloo, or on GPUs with
NCCL when CUDA is present.
"""

import argparse
import logging
import os
import socket
import sys
import time
import warnings
from collections.abc import Callable, Iterable
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn.functional as F
from torch import nn
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, EmbeddingCollection
from torchrec.datasets.utils import Batch
from torchrec.distributed.embedding import EmbeddingCollectionSharder
from torchrec.distributed.embedding_types import EmbeddingComputeKernel
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.model_parallel import DistributedModelParallel
from torchrec.distributed.planner import EmbeddingShardingPlanner, Topology
from torchrec.distributed.planner.storage_reservations import FixedPercentageStorageReservation
from torchrec.distributed.planner.types import (
    KernelConfig,
    ParameterConstraints,
    TopologyFactory,
    TrainerConfig,
)
from torchrec.distributed.types import ModuleSharder, ShardingEnv, ShardingPlanner, ShardingType
from torchrec.modules.embedding_configs import EmbeddingConfig, PoolingType
from torchrec.optim.optimizers import in_backward_optimizer_filter
from tqdm import tqdm

import dynemb
from dynemb.datasets import SyntheticClicks, roc_auc
from dynemb.models import SequenceDLRM
from dynemb.optimizer import EmbOptimType, OptimizerConfig
from dynemb.planner import DynamicEmbeddingShardingPlanner, DynamicEmbParameterConstraints
from dynemb.shard import DynamicEmbeddingBagCollectionSharder, DynamicEmbeddingCollectionSharder
from dynemb.tiering import PrefetchPipeline, distribute_for_prefetch, prefetch_distributed
from examples.publishing import ExamplePublisher

# Deprecation notices raised inside torch / TorchRec, which user code cannot act on.
warnings.filterwarnings("ignore", category=FutureWarning, module=r"(torch|torchrec)\.")
# torch.fx logs, once per process, that is_fx_tracing() also answers True under
# torch.export: TorchRec's modules call it on every forward, this example traces
# nothing, and the line (one per rank) only asks TorchRec to use another function.
logging.getLogger("torch.fx._symbolic_trace").setLevel(logging.ERROR)
# TorchRec's planner reserves this share of each device's memory for what is not an
# embedding table (dense layers, optimizer state, input batches).
RESERVED_MEMORY = 0.15

OPTIMIZERS = ("EXACT_SGD", "EXACT_ADAGRAD", "EXACT_ROWWISE_ADAGRAD", "ADAM")
DIST_TYPES = ("continuous", "roundrobin", "hash_roundrobin")
# CUSTOMIZED needs scores from the caller; NO_EVICTION grows instead of evicting.
SCORE_STRATEGIES = ("TIMESTAMP", "STEP", "LFU")
NUM_FEATURES = 8
SEQUENCE_FEATURE = "f7"  # the EmbeddingCollection's feature
ORDINARY_FEATURE = "f6"  # a TorchRec table even without --static


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        epilog="The default sizes (500k of W-quality's 1M training rows) finish in under a "
        "minute with torchrun --nproc_per_node=2 on 2 CPU cores (under 3 minutes on a busy "
        "machine). W-quality's sizes: --num_train 1000000 --seq_len 1 "
        "(benchmark/bench_quality.py).",
    )
    run = parser.add_argument_group("what to run")
    run.add_argument("--train", action="store_true", help="train for --epochs epochs")
    run.add_argument("--eval", action="store_true", help="held-out AUC after each epoch")
    run.add_argument("--dump", action="store_true", help="save a checkpoint to --checkpoint_dir")
    run.add_argument("--load", action="store_true", help="load --checkpoint_dir first")
    run.add_argument("--checkpoint_dir", default="dynemb_example_ckpt", help="for --dump/--load")
    run.add_argument(
        "--publish_every",
        "--publish-every",
        type=int,
        default=0,
        metavar="K",
        help="with --train: publish the model to --publish_dir before training "
        "(version 0), every K steps and after each epoch (1, 2, ...): the dynamic tables as "
        "a base checkpoint and deltas (dynemb.deltas), the dense layers and the ordinary "
        "table's changed rows beside them; examples/serve.py serves any version. 0: off",
    )
    run.add_argument(
        "--publish_dir",
        "--publish-dir",
        default="dynemb_example_deltas",
        help="for --publish_every: a new or empty directory",
    )
    run.add_argument(
        "--scores_out",
        default=None,
        help="with --eval: torch.save the held-out logits of each evaluation to this file "
        "(a list of {epoch, version, auc, logits}; logits in batch order, ranks after each other)",
    )
    model = parser.add_argument_group("tables and training")
    model.add_argument("--static", action="store_true", help="all tables ordinary TorchRec")
    model.add_argument(
        "--dist_type",
        choices=DIST_TYPES,
        default="roundrobin",
        help="how dynamic tables route raw ids to ranks",
    )
    model.add_argument(
        "--optimizer",
        choices=OPTIMIZERS,
        default="EXACT_ROWWISE_ADAGRAD",
        help="embedding optimizer (fused into the backward)",
    )
    model.add_argument("--learning_rate", type=float, default=0.05, help="embedding LR")
    model.add_argument("--dense_learning_rate", type=float, default=1e-3, help="Adam LR")
    model.add_argument("--batch_size", type=int, default=1024, help="samples per rank")
    model.add_argument(
        "--epochs",
        type=int,
        default=1,
        help="passes over the training rows; more than one overfits (the rows of rare ids "
        "memorise their few labels), as usual for click models",
    )
    model.add_argument("--embedding_dim", type=int, default=16, help="width of every table")
    model.add_argument(
        "--capacity",
        type=int,
        default=1 << 18,
        help="rows of each dynamic table (all ranks together)",
    )
    model.add_argument(
        "--score_strategy",
        choices=SCORE_STRATEGIES,
        default="TIMESTAMP",
        help="what an evicting dynamic table keeps when full (DynamicEmbScoreStrategy)",
    )
    model.add_argument(
        "--init_bound", type=float, default=0.05, help="new rows are uniform in [-bound, bound]"
    )
    model.add_argument(
        "--caching",
        action="store_true",
        help="dynamic tables in caching mode: a cache of --cache_fraction of the rows in "
        "front of a slow table holding all of them",
    )
    model.add_argument(
        "--cache_fraction", type=float, default=0.25, help="cache rows / capacity (--caching)"
    )
    model.add_argument(
        "--prefetch",
        action="store_true",
        help="with --caching: fetch batch t+1's rows into the caches while batch t trains",
    )
    model.add_argument("--seed", type=int, default=0, help="model seed (the data's is fixed)")
    data = parser.add_argument_group("data (dynemb.datasets.SyntheticClicks)")
    data.add_argument(
        "--num_train", type=int, default=500_000, help="training rows: a prefix of W-quality's 1M"
    )
    data.add_argument("--num_eval", type=int, default=100_000, help="held-out rows")
    data.add_argument("--vocab_size", type=int, default=1_000_000, help="ids per feature")
    data.add_argument(
        "--seq_len",
        type=int,
        default=4,
        help=f"ids per sample of {SEQUENCE_FEATURE}: uniform in [1, seq_len]",
    )
    args = parser.parse_args(argv)
    if not (args.train or args.eval or args.dump or args.load):
        parser.error("nothing to do: give --train, --eval, --dump and/or --load")
    return args


# --- data --------------------------------------------------------------------------------


def make_dataset(args: argparse.Namespace) -> SyntheticClicks:
    """The synthetic clicks; every rank generates the same rows (deterministic)."""
    max_ids = [1] * NUM_FEATURES
    max_ids[int(SEQUENCE_FEATURE[1:])] = args.seq_len
    return SyntheticClicks(
        num_train=args.num_train,
        num_eval=args.num_eval,
        num_features=NUM_FEATURES,
        vocab_size=args.vocab_size,
        max_ids_per_feature=max_ids,
    )


def no_cpu_adam(args: argparse.Namespace) -> bool:
    """ADAM on CPU, which fbgemm's CPU TBE (TorchRec's FUSED kernel) does not have."""
    return args.optimizer == "ADAM" and not torch.cuda.is_available()


def dynamic_features(args: argparse.Namespace) -> set[str]:
    """Features looked up in dynamic tables (their ids are given raw, spread over 63 bits)."""
    if args.static:
        return set()
    everything = {f"f{i}" for i in range(NUM_FEATURES)}
    return everything if no_cpu_adam(args) else everything - {ORDINARY_FEATURE}


def id_views(args: argparse.Namespace) -> dict[str, str]:
    dynamic = dynamic_features(args)
    return {f"f{i}": "raw" if f"f{i}" in dynamic else "row" for i in range(NUM_FEATURES)}


# --- model, plan, DMP --------------------------------------------------------------------


def table_configs(
    args: argparse.Namespace,
) -> tuple[list[EmbeddingBagConfig], list[EmbeddingConfig]]:
    """One table per feature: pooled (MEAN) tables for f0..f6, a sequence table for f7.

    A dynamic table's ``num_embeddings`` is its capacity (ids are not bounded by it);
    an ordinary table's is the vocabulary (ids are rows).
    """
    dynamic = dynamic_features(args)

    def common(feature: str) -> dict:
        rows = args.capacity if feature in dynamic else args.vocab_size
        return dict(
            name=f"t_{feature}",
            embedding_dim=args.embedding_dim,
            num_embeddings=rows,
            feature_names=[feature],
            weight_init_min=-args.init_bound,
            weight_init_max=args.init_bound,
        )

    features = [f"f{i}" for i in range(NUM_FEATURES)]
    pooled = [
        EmbeddingBagConfig(pooling=PoolingType.MEAN, **common(f))
        for f in features
        if f != SEQUENCE_FEATURE
    ]
    return pooled, [EmbeddingConfig(**common(SEQUENCE_FEATURE))]


def build_model(
    args: argparse.Namespace, num_dense: int, pg: dist.ProcessGroup, device: torch.device
) -> DistributedModelParallel:
    """The model on the meta device, planned and sharded by DistributedModelParallel."""
    pooled, sequence = table_configs(args)
    model = unsharded_model(args, num_dense)
    fused_params = {
        "optimizer": EmbOptimType[args.optimizer],
        "learning_rate": args.learning_rate,
        "eps": 1e-8,
    }
    world_size = dist.get_world_size(pg)
    # Through TopologyFactory, as TorchRec asks (it validates the hardware figures);
    # HBM / DDR capacities are TorchRec's defaults.
    topology = TopologyFactory.create_topology(
        trainer_config=TrainerConfig(
            world_size=world_size,
            local_world_size=int(os.environ.get("LOCAL_WORLD_SIZE", world_size)),
        ),
        kernel_config=KernelConfig(compute_device=device.type),
    )
    if args.static:
        sharders, planner = static_planner(args, pooled + sequence, topology, fused_params)
    else:
        sharders, planner = dynamic_planner(args, pooled + sequence, topology, fused_params)
    plan = planner.collective_plan(model, sharders, pg)
    return DistributedModelParallel(
        model,
        env=ShardingEnv.from_process_group(pg),
        plan=plan,
        sharders=sharders,
        device=device,
    )


def unsharded_model(args: argparse.Namespace, num_dense: int) -> SequenceDLRM:
    """The DLRM with its embedding collections on the meta device (the sharders
    materialise them) and its dense layers on the CPU (DistributedModelParallel moves them)."""
    pooled, sequence = table_configs(args)
    meta = torch.device("meta")
    return SequenceDLRM(
        EmbeddingBagCollection(tables=pooled, device=meta),
        dense_in_features=num_dense,
        dense_arch_layer_sizes=[64, args.embedding_dim],
        over_arch_layer_sizes=[64, 32, 1],
        embedding_collection=EmbeddingCollection(tables=sequence, device=meta),
    )


def ordinary_constraints(device: torch.device) -> ParameterConstraints:
    """TorchRec tables: TABLE_WISE with fbgemm's TBE (FUSED). The kernel is forced because
    TorchRec's CPU estimators reject the uvm kernels the planner would also try."""
    return ParameterConstraints(
        sharding_types=[ShardingType.TABLE_WISE.value],
        compute_kernels=[EmbeddingComputeKernel.FUSED.value] if device.type == "cpu" else None,
    )


Tables = list[EmbeddingBagConfig | EmbeddingConfig]
Planned = tuple[list[ModuleSharder[nn.Module]], ShardingPlanner]


def static_planner(
    args: argparse.Namespace, tables: Tables, topology: Topology, fused_params: dict
) -> Planned:
    """Plain TorchRec: its sharders and planner, every table ordinary."""
    device = torch.device(topology.compute_device)
    sharders = [
        EmbeddingBagCollectionSharder(fused_params=fused_params),
        EmbeddingCollectionSharder(fused_params=fused_params),
    ]
    constraints = {t.name: ordinary_constraints(device) for t in tables}
    planner = EmbeddingShardingPlanner(
        topology=topology, constraints=constraints, storage_reservation=storage_reservation()
    )
    return sharders, planner


def dynamic_planner(
    args: argparse.Namespace, tables: Tables, topology: Topology, fused_params: dict
) -> Planned:
    """dynemb: dynamic tables marked by their constraints; the ordinary table stays TorchRec's.

    The dynemb sharders are drop-ins for TorchRec's: they shard the ordinary table as
    TorchRec would. The planner turns ``num_embeddings`` of a dynamic table into each
    rank's capacity (``num_embeddings / world_size`` rows).
    """
    device = torch.device(topology.compute_device)
    dynamic = dynamic_features(args)
    options = dynamic_table_options(args)
    constraints = {}
    for t in tables:
        if t.feature_names[0] in dynamic:
            constraints[t.name] = DynamicEmbParameterConstraints(
                sharding_types=[ShardingType.ROW_WISE.value],
                use_dynamicemb=True,
                dynamicemb_options=options,
            )
        else:
            constraints[t.name] = ordinary_constraints(device)
    sharders = [
        DynamicEmbeddingBagCollectionSharder(fused_params=fused_params),
        DynamicEmbeddingCollectionSharder(fused_params=fused_params),
    ]
    planner = DynamicEmbeddingShardingPlanner(
        eb_configs=tables,
        topology=topology,
        constraints=constraints,
        storage_reservation=storage_reservation(),
    )
    return sharders, planner


def dynamic_table_options(args: argparse.Namespace) -> dynemb.DynamicEmbTableOptions:
    """Every dynamic table's options (the planner fills in dim and capacity per rank)."""
    return dynemb.DynamicEmbTableOptions(
        initializer_args=dynemb.DynamicEmbInitializerArgs(
            mode=dynemb.DynamicEmbInitializerMode.UNIFORM,
            lower=-args.init_bound,
            upper=args.init_bound,
        ),
        score_strategy=dynemb.DynamicEmbScoreStrategy[args.score_strategy],
        dist_type=args.dist_type,
        seed=args.seed,
        **cache_options(args),
    )


def storage_reservation() -> FixedPercentageStorageReservation:
    """A fixed share of memory kept for dense tensors, as TorchRec recommends for a model
    built on the meta device: its default reservation sizes the dense tensors from
    parameters that are not materialised yet (and says so in a warning)."""
    return FixedPercentageStorageReservation(percentage=RESERVED_MEMORY)


def cache_options(args: argparse.Namespace) -> dict:
    """``--caching``: the cache's bytes over all ranks (the planner splits them)."""
    if not args.caching:
        return {}
    state = OptimizerConfig(EmbOptimType[args.optimizer]).state_columns(args.embedding_dim)
    row_bytes = 4 * (args.embedding_dim + state)
    return {
        "caching": True,
        "global_hbm_for_values": int(args.cache_fraction * args.capacity) * row_bytes,
    }


def dense_optimizer(model: nn.Module, args: argparse.Namespace) -> torch.optim.Optimizer:
    """Adam over the dense parameters (the embeddings' optimizer is fused into backward)."""
    params = [p for _, p in in_backward_optimizer_filter(model.named_parameters())]
    return torch.optim.Adam(params, lr=args.dense_learning_rate)


# --- training and evaluation -------------------------------------------------------------


def train_epoch(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    batches: Iterable[Batch],
    device: torch.device,
    desc: str,
    progress: bool,
    prefetch: bool = False,
    after_step: Callable[[], None] | None = None,
) -> float:
    """One pass over ``batches``; returns the mean training loss over all ranks.

    ``prefetch``: run dynemb.tiering.PrefetchPipeline (caching mode), which overlaps
    the prefetch of each next batch with the training of the current one.
    ``after_step``: called after each optimizer step (a batch boundary).
    """
    model.train()
    total = torch.zeros(2, dtype=torch.float64)  # loss sum, samples
    bar = tqdm(batches, desc=desc, unit="batch", disable=not progress, file=sys.stderr)

    def step(batch: Batch) -> torch.Tensor:
        batch = batch.to(device)
        logits = model(batch.dense_features, batch.sparse_features)
        loss = F.binary_cross_entropy_with_logits(logits, batch.labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if after_step is not None:
            after_step()
        return torch.tensor([loss.item() * len(batch.labels), len(batch.labels)])

    if prefetch:
        steps = PrefetchPipeline(bar, step, prefetch_distributed, distribute_batch(model, device))
    else:
        steps = map(step, bar)
    for done in steps:
        total += done
        bar.set_postfix(loss=f"{total[0] / total[1]:.4f}", refresh=False)
    dist.all_reduce(total)
    return float(total[0] / total[1])


def distribute_batch(model: nn.Module, device: torch.device):
    """--prefetch: a batch's input dist to each sharded collection of the SequenceDLRM."""
    dlrm = model.module

    def distribute(batch: Batch) -> list:
        pooled, sequences = dlrm.split_features(batch.to(device).sparse_features)
        parts = [(dlrm.embedding_bag_collection, pooled)]
        if dlrm.embedding_collection is not None:
            parts.append((dlrm.embedding_collection, sequences))
        return [distribute_for_prefetch(module, features) for module, features in parts]

    return distribute


@torch.no_grad()
def evaluate(
    model: nn.Module, batches: Iterable[Batch], device: torch.device, desc: str, progress: bool
) -> float:
    """Held-out AUC over all ranks' predictions (gathered, then ranked)."""
    return evaluate_logits(model, batches, device, desc, progress)[0]


@torch.no_grad()
def evaluate_logits(
    model: nn.Module, batches: Iterable[Batch], device: torch.device, desc: str, progress: bool
) -> tuple[float, torch.Tensor]:
    """``evaluate``'s AUC, and the logits it ranked (rank 0's batches, then rank 1's, ...)."""
    model.eval()
    scores, labels = [], []
    for batch in tqdm(batches, desc=desc, unit="batch", disable=not progress, file=sys.stderr):
        batch = batch.to(device)
        scores.append(model(batch.dense_features, batch.sparse_features).float().cpu())
        labels.append(batch.labels.cpu())
    local = torch.stack([torch.cat(scores), torch.cat(labels)])  # same size on every rank
    gathered = [torch.empty_like(local) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, local)
    everything = torch.cat(gathered, dim=1)
    return roc_auc(everything[0], everything[1]), everything[0]


# --- publication -------------------------------------------------------------------------


def publish_refusal(args: argparse.Namespace) -> str | None:
    """Why ``--publish_every`` cannot run with these arguments, or None."""
    if args.publish_every == 0:
        return None
    flag = f"--publish_every {args.publish_every}"
    if args.publish_every < 0:
        return f"{flag}: K must be a number of steps >= 1 (0: off)"
    if not args.train:
        return f"{flag} publishes during training: give --train"
    if args.static or args.caching:
        return (
            f"{flag} publishes dynamic tables without a cache: not with "
            f"{'--static' if args.static else '--caching'}"
        )
    directory = Path(args.publish_dir)
    if directory.exists() and (not directory.is_dir() or any(directory.iterdir())):
        return f"--publish_dir {directory}: must be a new or empty directory, it holds files"
    return None


# --- checkpoints -------------------------------------------------------------------------


def load_checkpoint(model: nn.Module, args: argparse.Namespace) -> None:
    """Dynamic tables from dynemb's checkpoint (any world size), the rest (dense layers,
    ordinary TorchRec tables) from torch.distributed.checkpoint."""
    dynemb.DynamicEmbLoad(os.path.join(args.checkpoint_dir, "dynamic"), model, optim=True)
    state = model.state_dict()
    dcp.load(state, checkpoint_id=os.path.join(args.checkpoint_dir, "torchrec"))
    model.load_state_dict(state, strict=False)


def dump_checkpoint(model: nn.Module, args: argparse.Namespace) -> None:
    dynemb.DynamicEmbDump(
        os.path.join(args.checkpoint_dir, "dynamic"), model, optim=True, allow_overwrite=True
    )
    dcp.save(model.state_dict(), checkpoint_id=os.path.join(args.checkpoint_dir, "torchrec"))


# --- main --------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.static and no_cpu_adam(args):
        print(
            "--static --optimizer ADAM: fbgemm's CPU TBE has no Adam (dynemb's tables do)",
            file=sys.stderr,
        )
        return 2
    if (args.prefetch or args.caching) and args.static:
        print("--caching / --prefetch are options of dynamic tables, not --static", file=sys.stderr)
        return 2
    if args.prefetch and not args.caching:
        print("--prefetch fills the caches of --caching: pass both", file=sys.stderr)
        return 2
    refusal = publish_refusal(args)
    if refusal:
        print(refusal, file=sys.stderr)
        return 2
    start = time.perf_counter()
    cuda = torch.cuda.is_available()
    if "RANK" not in os.environ:  # plain `python example.py`: a world of one
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = str(s.getsockname()[1])
        os.environ.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
    dist.init_process_group(backend="nccl" if cuda else "gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    device = torch.device(f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}" if cuda else "cpu")
    if cuda:
        torch.cuda.set_device(device)
    torch.manual_seed(args.seed)
    lead = rank == 0
    try:
        data = make_dataset(args)
        views = id_views(args)
        model = build_model(args, data.num_dense, dist.group.WORLD, device)
        optimizer = dense_optimizer(model, args)
        if lead:
            if not args.static and no_cpu_adam(args):
                print(
                    f"note: ADAM on CPU: {ORDINARY_FEATURE} is dynamic too (fbgemm's CPU TBE, "
                    "which would hold the ordinary table, has no Adam)",
                    flush=True,
                )
            kind = "static (TorchRec)" if args.static else f"dynamic ({args.dist_type})"
            print(
                f"{world_size} rank(s) on {device.type}; tables: {kind}; optimizer "
                f"{args.optimizer}; {args.num_train} training rows, {args.num_eval} "
                f"held-out; Bayes AUC {data.bayes_auc('eval'):.4f}",
                flush=True,
            )
        if args.load:
            load_checkpoint(model, args)
        publisher = None
        if args.publish_every:
            dynamic = {f"t_{f}" for f in dynamic_features(args)}
            publisher = ExamplePublisher(
                model, args.publish_dir, args.publish_every, dynamic, vars(args)
            )
            publisher.publish_base()
            if lead:
                print(f"published version 0 (the base) to {args.publish_dir}", flush=True)
        batches = dict(batch_size=args.batch_size, rank=rank, world_size=world_size, id_view=views)
        scores = []  # --scores_out

        def held_out(epoch: int) -> str:
            """Evaluates; the AUC (and the version it is) as printed."""
            auc, logits = evaluate_logits(
                model, data.batches("eval", **batches), device, "eval", lead
            )
            version = publisher.version if publisher is not None else None
            scores.append(dict(epoch=epoch, version=version, auc=auc, logits=logits))
            published = f" (published version {version})" if version is not None else ""
            return f"held-out AUC {auc:.4f}{published}"

        for epoch in range(1, args.epochs + 1) if args.train else ():
            loss = train_epoch(
                model,
                optimizer,
                data.batches("train", **batches),
                device,
                f"train {epoch}/{args.epochs}",
                lead,
                prefetch=args.prefetch,
                after_step=publisher.after_step if publisher is not None else None,
            )
            if publisher is not None:
                publisher.publish_pending()  # the epoch's last steps
            line = f"epoch {epoch}/{args.epochs}: train loss {loss:.4f}"
            if args.eval:
                line += ", " + held_out(epoch)
            if lead:
                print(line, flush=True)
        if args.eval and not args.train:
            line = held_out(0)
            if lead:
                print(line, flush=True)
        if publisher is not None:
            publisher.close()
            if lead:
                print(
                    f"published versions 0..{publisher.version} to {args.publish_dir}", flush=True
                )
        if args.scores_out and lead:
            torch.save(scores, args.scores_out)
        if args.dump:
            dump_checkpoint(model, args)
        if lead:
            print(f"done in {time.perf_counter() - start:.1f} s", flush=True)
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
