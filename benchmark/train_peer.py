"""bench_train.py's peer: TorchRec's EmbeddingBagCollection sharded by DMP at world
size 1, FUSED kernel (fbgemm's TBE), or FUSED_UVM_CACHING with a share of the rows in
HBM, trained on the same batches as dynemb."""

import torch
from dmp_setup import planner_inputs, single_process_group
from train_workloads import (
    Config,
    feature_names,
    make_batches,
    summarize,
    table_names,
    time_steps,
)

PEER_IMPL = "torchrec.EBC.FUSED"
UVM_PEER_IMPL = "torchrec.EBC.FUSED_UVM_CACHING"
PEER_OPTIMIZERS = ("EXACT_ROWWISE_ADAGRAD", "EXACT_SGD", "EXACT_ADAGRAD")


def has_peer(config: Config) -> bool:
    """Whether TorchRec's kernel has ``config.optimizer`` (fbgemm's CPU TBE has no Adam,
    fbgemm no FTRL)."""
    return config.optimizer in PEER_OPTIMIZERS or (
        config.device == "cuda" and config.optimizer == "ADAM"
    )


def peer_impl(config: Config) -> str:
    return PEER_IMPL if config.hbm_fraction is None else UVM_PEER_IMPL


def build_torchrec_peer(config: Config) -> torch.nn.Module:
    """The DMP-sharded EBC (TABLE_WISE, fused optimizer) on ``config.device``: FUSED
    kernel, or FUSED_UVM_CACHING with ``cache_load_factor = hbm_fraction``."""
    import torch.distributed as dist
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    from torchrec import EmbeddingBagCollection, EmbeddingBagConfig
    from torchrec.distributed.embedding_types import EmbeddingComputeKernel
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.distributed.planner import EmbeddingShardingPlanner
    from torchrec.distributed.planner.types import ParameterConstraints
    from torchrec.distributed.types import CacheParams, ShardingEnv, ShardingType
    from torchrec.modules.embedding_configs import PoolingType

    tables = [
        EmbeddingBagConfig(
            name=name,
            embedding_dim=config.dim,
            num_embeddings=config.num_ids,
            feature_names=[feature],
            pooling=PoolingType.SUM,
        )
        for name, feature in zip(table_names(config), feature_names(config), strict=True)
    ]
    ebc = EmbeddingBagCollection(tables=tables, device=torch.device("meta"))
    fused_params = {
        "optimizer": EmbOptimType[config.optimizer],
        "learning_rate": config.learning_rate,
        "eps": config.eps,
    }
    sharder = EmbeddingBagCollectionSharder(fused_params=fused_params)
    kernel = EmbeddingComputeKernel.FUSED
    cache = None
    if config.hbm_fraction is not None:
        kernel = EmbeddingComputeKernel.FUSED_UVM_CACHING
        cache = CacheParams(load_factor=config.hbm_fraction)
    constraint = ParameterConstraints(
        sharding_types=[ShardingType.TABLE_WISE.value],
        compute_kernels=[kernel.value],
        cache_params=cache,
    )
    planner = EmbeddingShardingPlanner(
        constraints={name: constraint for name in table_names(config)},
        **planner_inputs(1, config.device),
    )
    plan = planner.collective_plan(ebc, [sharder], dist.group.WORLD)
    model = DistributedModelParallel(
        ebc,
        env=ShardingEnv.from_process_group(dist.group.WORLD),
        device=torch.device(config.device),
        plan=plan,
        sharders=[sharder],
    )
    check_peer(model, config)
    return model


def check_peer(model: torch.nn.Module, config: Config) -> None:
    """Asserts that the sharded model runs fbgemm's TBE (CPU or GPU, as ``config.device``)
    with the requested optimizer."""
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
        SplitTableBatchedEmbeddingBagsCodegen,
    )

    # ShardedEmbeddingBagCollection keeps its lookups in a plain list (not submodules),
    # with no public accessor.
    lookups = model.module._lookups  # noqa: SLF001 - TorchRec keeps its lookups private
    tbes = [
        m
        for lookup in lookups
        for m in lookup.modules()
        if isinstance(m, SplitTableBatchedEmbeddingBagsCodegen)
    ]
    assert tbes, "no fbgemm TBE in the sharded model: not the FUSED kernel"
    for tbe in tbes:
        assert tbe.use_cpu == (config.device == "cpu"), tbe.use_cpu
        assert tbe.optimizer == EmbOptimType[config.optimizer], tbe.optimizer
        assert abs(tbe.get_learning_rate() - config.learning_rate) < 1e-9


def run_torchrec(config: Config) -> dict | None:
    """Trains the peer on ``config``'s batches; None without a peer (ADAM on CPU)."""
    if not has_peer(config):
        return None
    from torchrec import KeyedJaggedTensor

    device = torch.device(config.device)
    batches = make_batches(config)
    lengths = torch.full((config.num_tables * config.batch,), config.pooling_factor)
    inputs = [
        KeyedJaggedTensor(keys=feature_names(config), values=b, lengths=lengths).to(device)
        for b in batches
    ]
    with single_process_group(config.device):
        model = build_torchrec_peer(config)

        def step(kjt: KeyedJaggedTensor) -> None:
            model(kjt).values().sum().backward()

        desc = f"{peer_impl(config)} {config.optimizer}"
        times = time_steps(step, inputs, config.warmup, desc, device)
    return summarize(config, times)
