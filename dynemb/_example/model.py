"""The example's model: table configs, the plan (TorchRec's planner, or dynemb's with
dynamic tables marked by their constraints), the DistributedModelParallel model and
the dense optimizer. As NVIDIA DynamicEmb's example: tables on the meta device, a
constraint per table, the planner's plan, DMP with the dynamic sharders, the embedding
optimizer in the sharders' ``fused_params``."""

import argparse
import os

import torch
import torch.distributed as dist
from torch import nn
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, EmbeddingCollection
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

from dynemb._example.arguments import NUM_FEATURES, SEQUENCE_FEATURE
from dynemb._example.data import dynamic_features
from dynemb.admission_strategies import ProbabilisticAdmissionStrategy
from dynemb.config.optimizer import OptimizerConfig, optimizer_type_of
from dynemb.config.table_options import DynamicEmbInitializerArgs, DynamicEmbTableOptions
from dynemb.config.types import DynamicEmbInitializerMode, DynamicEmbScoreStrategy
from dynemb.models import SequenceDLRM
from dynemb.planner.constraints import DynamicEmbParameterConstraints
from dynemb.planner.planner import DynamicEmbeddingShardingPlanner
from dynemb.shard.sharders import (
    DynamicEmbeddingBagCollectionSharder,
    DynamicEmbeddingCollectionSharder,
)

# TorchRec's planner reserves this share of each device's memory for what is not an
# embedding table (dense layers, optimizer state, input batches).
RESERVED_MEMORY = 0.15


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
        "optimizer": optimizer_type_of(args.optimizer),
        "learning_rate": args.learning_rate,
        "eps": 1e-8,
        # FTRL: the paper's square root, beta 1 to damp the first steps, no regularisation
        **({"ftrl_beta": 1.0} if args.optimizer == "FTRL" else {}),
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


def dynamic_table_options(args: argparse.Namespace) -> DynamicEmbTableOptions:
    """Every dynamic table's options (the planner fills in dim and capacity per rank)."""
    return DynamicEmbTableOptions(
        initializer_args=DynamicEmbInitializerArgs(
            mode=DynamicEmbInitializerMode.UNIFORM,
            lower=-args.init_bound,
            upper=args.init_bound,
        ),
        score_strategy=DynamicEmbScoreStrategy[args.score_strategy],
        dist_type=args.dist_type,
        seed=args.seed,
        embedding_dtype=getattr(torch, args.embedding_dtype),
        stochastic_rounding=args.stochastic_rounding,
        admit_strategy=admission_strategy(args),
        **cache_options(args),
    )


def admission_strategy(args: argparse.Namespace):
    """``--admission_probability``: a ProbabilisticAdmissionStrategy (a key not admitted
    reads the table's initializer row), else None (every key is stored)."""
    p = getattr(args, "admission_probability", None)
    return None if p is None else ProbabilisticAdmissionStrategy(p, seed=args.seed)


def storage_reservation() -> FixedPercentageStorageReservation:
    """A fixed share of memory kept for dense tensors, as TorchRec recommends for a model
    built on the meta device: its default reservation sizes the dense tensors from
    parameters that are not materialised yet (and says so in a warning)."""
    return FixedPercentageStorageReservation(percentage=RESERVED_MEMORY)


def cache_options(args: argparse.Namespace) -> dict:
    """``--caching``: the cache's bytes over all ranks (the planner splits them)."""
    if not args.caching:
        return {}
    state = OptimizerConfig(optimizer_type_of(args.optimizer)).state_columns(args.embedding_dim)
    row_bytes = getattr(torch, args.embedding_dtype).itemsize * (args.embedding_dim + state)
    return {
        "caching": True,
        "global_hbm_for_values": int(args.cache_fraction * args.capacity) * row_bytes,
    }


def dense_optimizer(model: nn.Module, args: argparse.Namespace) -> torch.optim.Optimizer:
    """Adam over the dense parameters (the embeddings' optimizer is fused into backward)."""
    params = [p for _, p in in_backward_optimizer_filter(model.named_parameters())]
    return torch.optim.Adam(params, lr=args.dense_learning_rate)
