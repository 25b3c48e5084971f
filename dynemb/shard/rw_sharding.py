"""Row-wise sharding of dynamic tables: TorchRec's RW sharding with our routing and kernels.

A module's ROW_WISE tables share one sharding (TorchRec fuses them by sharding
type), so dynamic and ordinary row-wise tables can sit in the same one: each
feature is routed by its own rule (``routing.py``) and each group of tables gets
its kernel (ours for CUSTOMIZED_KERNEL groups, TorchRec's otherwise).
"""

from typing import Any

import torch
from torchrec.distributed.embedding_lookup import (
    GroupedEmbeddingsLookup,
    GroupedPooledEmbeddingsLookup,
)
from torchrec.distributed.embedding_sharding import EmbeddingShardingInfo
from torchrec.distributed.embedding_types import GroupedEmbeddingConfig
from torchrec.distributed.sharding.rw_sequence_sharding import RwSequenceEmbeddingSharding
from torchrec.distributed.sharding.rw_sharding import RwPooledEmbeddingSharding
from torchrec.distributed.types import ShardingEnv, ShardingType

from dynemb.config.table_options import DynamicEmbTableOptions
from dynemb.distributed.routing import (
    STATIC,
    DynamicEmbRwSparseFeaturesDist,
    check_dist_type,
    continuous_block,
)
from dynemb.distributed.sharding_names import (
    DYNAMIC_KERNEL,
    DYNAMIC_KERNEL_NAME,
    DYNAMIC_SHARDING_TYPES,
)
from dynemb.shard.compute_kernel import BatchedDynamicEmbedding, BatchedDynamicEmbeddingBag
from dynemb.shard.hot_dist import (
    HotRwPooledEmbeddingDist,
    HotRwSequenceEmbeddingDist,
    HotRwSparseFeaturesDist,
    HotSharding,
)
from dynemb.shard.output_dist import RwUnevenPooledEmbeddingDist


def is_dynamic(info: EmbeddingShardingInfo) -> bool:
    return info.param_sharding.compute_kernel == DYNAMIC_KERNEL_NAME


def dynamic_options(infos: list[EmbeddingShardingInfo]) -> dict[str, DynamicEmbTableOptions]:
    """Table name -> per-rank options of the dynamic tables, checked against their configs."""
    options = {}
    for info in infos:
        if not is_dynamic(info):
            continue
        name = info.embedding_config.name
        opts = getattr(info.param_sharding, "dynamicemb_options", None)
        if not isinstance(opts, DynamicEmbTableOptions):
            raise ValueError(
                f"table {name!r} uses the dynamic kernel but its plan entry is a "
                f"{type(info.param_sharding).__name__}, not a DynamicEmbParameterSharding: "
                "plan with dynemb.planner.DynamicEmbeddingShardingPlanner"
            )
        if opts.max_capacity is None or opts.dim is None:
            raise ValueError(
                f"table {name!r}: dynamicemb_options needs dim and max_capacity (the planner fills them)"
            )
        if info.embedding_config.has_feature_processor:
            raise ValueError(
                f"table {name!r}: feature processors are not supported on dynamic tables"
            )
        check_dist_type(name, opts.dist_type)
        options[name] = opts
    return options


def ordinary_tables(infos: list[EmbeddingShardingInfo]) -> set[str]:
    """Names of the ordinary tables held as dynamic ones (plan entries with ``ordinary_table``)."""
    names = set()
    for info in infos:
        if is_dynamic(info) and getattr(info.param_sharding, "ordinary_table", False):
            name = info.embedding_config.name
            dist_type = info.param_sharding.dynamicemb_options.dist_type
            if dist_type != "continuous":
                raise ValueError(
                    f"table {name!r}: an ordinary table held as a dynamic one is routed "
                    f"'continuous' (TorchRec's row-wise blocks), got dist_type {dist_type!r}"
                )
            names.add(name)
    return names


def check_sharding_type(sharding_type: str, infos: list[EmbeddingShardingInfo]) -> bool:
    """True when this sharding holds dynamic tables (which must then be of a
    ``DYNAMIC_SHARDING_TYPES`` type)."""
    dynamic = [i.embedding_config.name for i in infos if is_dynamic(i)]
    if dynamic and sharding_type not in DYNAMIC_SHARDING_TYPES:
        raise ValueError(
            f"dynamic tables {dynamic} are planned {sharding_type!r}; dynamic tables are "
            f"sharded {' or '.join(DYNAMIC_SHARDING_TYPES)}"
        )
    hot = [
        i.embedding_config.name
        for i in infos
        if is_dynamic(i)
        and getattr(getattr(i.param_sharding, "dynamicemb_options", None), "hot_replicas", 0)
    ]
    if hot and sharding_type != ShardingType.ROW_WISE.value:
        raise ValueError(
            f"tables {hot} set hot_replicas but are planned {sharding_type!r}; hot keys "
            "are copied to every rank for row_wise tables only (set hot_replicas=0 or "
            "plan them row_wise)"
        )
    return bool(dynamic)


def _bounded_features(configs: list[GroupedEmbeddingConfig], ordinary: set[str]) -> list:
    return [
        table.name if table.name in ordinary else None
        for group in configs
        for table in group.embedding_tables
        for _ in range(table.num_features())
    ]


def feature_routes(configs: list[GroupedEmbeddingConfig], options) -> list[tuple[str, int]]:
    """Per feature of ``configs``, in order, how its keys are routed: ``(dist_type,
    num_embeddings)``; ``STATIC`` for the ordinary tables (those not in ``options``)."""
    routes = []
    for group in configs:
        for table in group.embedding_tables:
            opts = options.get(table.name)
            route = (opts.dist_type if opts else STATIC, table.num_embeddings)
            routes.extend([route] * table.num_features())
    return routes


class _DynamicRwMixin:
    """What both shardings add to TorchRec's: the options, and the routing input dist."""

    def _init_dynamic(self, sharding_infos) -> None:
        self._dynamic_options = dynamic_options(sharding_infos)
        self._ordinary = ordinary_tables(sharding_infos)
        self._hot: HotSharding | None = None

    def _init_hot(self) -> None:
        """The hot keys of tables with ``hot_replicas`` (hot_keys.py), once the
        grouped configs are known."""
        if not HotSharding.wanted(self._dynamic_options, self._pg):
            return
        for name in self._ordinary:
            if self._dynamic_options[name].hot_replicas:
                raise ValueError(
                    f"table {name!r}: hot_replicas is for dynamic tables, not for an "
                    "ordinary table held as a dynamic one"
                )
        tables = [
            table.name
            for group in self._grouped_embedding_configs
            for table in group.embedding_tables
            for _ in range(table.num_features())
        ]
        dims = [
            table.embedding_dim
            for group in self._grouped_embedding_configs
            for table in group.embedding_tables
            for _ in range(table.num_features())
        ]
        self._hot = HotSharding(tables, self._dynamic_options, dims, self._pg)

    def _ordinary_keys(self) -> dict[str, range]:
        """This rank's ids of each ordinary table held as a dynamic one (stored at build)."""
        return {
            table.name: continuous_block(table.num_embeddings, self._world_size, self._rank)
            for group in self._grouped_embedding_configs
            for table in group.embedding_tables
            if table.name in self._ordinary
        }

    def _dynamic_input_dist(self, device, is_sequence: bool) -> DynamicEmbRwSparseFeaturesDist:
        if self._hot is not None:
            return HotRwSparseFeaturesDist(self._hot, **self._input_dist_args(device, is_sequence))
        return DynamicEmbRwSparseFeaturesDist(**self._input_dist_args(device, is_sequence))

    def _input_dist_args(self, device, is_sequence: bool) -> dict:
        return dict(
            pg=self._pg,
            feature_routes=feature_routes(self._grouped_embedding_configs, self._dynamic_options),
            device=device if device is not None else self._device,
            is_sequence=is_sequence,
            bounded=_bounded_features(self._grouped_embedding_configs, self._ordinary),
        )

    def count_accesses_in_weights(self) -> None:
        """The features' weights are per-id access counts (``use_index_dedup``): the
        hot keys count them as their accesses."""
        if self._hot is not None:
            self._hot.counts_in_weights = True

    def _bind_hot(self, lookup):
        if self._hot is not None:
            self._hot.bind(lookup)
        return lookup


class DynamicEmbRwPooledEmbeddingSharding(_DynamicRwMixin, RwPooledEmbeddingSharding):
    """Row-wise pooled sharding (EBC) holding dynamic tables."""

    def __init__(self, sharding_infos, env: ShardingEnv, device=None, qcomm_codecs_registry=None):
        self._init_dynamic(sharding_infos)
        super().__init__(sharding_infos, env, device, qcomm_codecs_registry=qcomm_codecs_registry)
        self._init_hot()

    def create_input_dist(self, device: torch.device | None = None):
        return self._dynamic_input_dist(device, is_sequence=False)

    def create_output_dist(self, device: torch.device | None = None):
        if self._hot is not None:
            return HotRwPooledEmbeddingDist(
                self._hot,
                self._pg,
                qcomm_codecs_registry=self.qcomm_codecs_registry,
                embedding_dims=self.embedding_dims(),
            )
        return RwUnevenPooledEmbeddingDist(
            self._pg,
            qcomm_codecs_registry=self.qcomm_codecs_registry,
            embedding_dims=self.embedding_dims(),
        )

    def create_lookup(self, device=None, fused_params=None, feature_processor=None):
        lookup = DynamicEmbGroupedPooledEmbeddingsLookup(
            self._dynamic_options,
            self._ordinary_keys(),
            grouped_configs=self._grouped_embedding_configs,
            pg=self._pg,
            device=device if device is not None else self._device,
            feature_processor=feature_processor,
            sharding_type=ShardingType.ROW_WISE,
            env=self._env,
        )
        return self._bind_hot(lookup)


class DynamicEmbRwSequenceEmbeddingSharding(_DynamicRwMixin, RwSequenceEmbeddingSharding):
    """Row-wise sequence sharding (EC) holding dynamic tables."""

    def __init__(self, sharding_infos, env: ShardingEnv, device=None, qcomm_codecs_registry=None):
        self._init_dynamic(sharding_infos)
        super().__init__(sharding_infos, env, device, qcomm_codecs_registry=qcomm_codecs_registry)
        self._init_hot()

    def create_input_dist(self, device: torch.device | None = None):
        return self._dynamic_input_dist(device, is_sequence=True)

    def create_output_dist(self, device: torch.device | None = None):
        if self._hot is None:
            return super().create_output_dist(device)
        return HotRwSequenceEmbeddingDist(
            self._hot,
            self._pg,
            self._get_num_features(),
            device if device is not None else self._device,
            qcomm_codecs_registry=self.qcomm_codecs_registry,
        )

    def create_lookup(self, device=None, fused_params=None, feature_processor=None):
        lookup = DynamicEmbGroupedEmbeddingsLookup(
            self._dynamic_options,
            self._ordinary_keys(),
            grouped_configs=self._grouped_embedding_configs,
            pg=self._pg,
            device=device if device is not None else self._device,
            env=self._env,
        )
        return self._bind_hot(lookup)


class DynamicEmbGroupedPooledEmbeddingsLookup(GroupedPooledEmbeddingsLookup):
    """TorchRec's pooled lookup; CUSTOMIZED_KERNEL groups get BatchedDynamicEmbeddingBag."""

    def __init__(
        self,
        dynamic_options: dict[str, DynamicEmbTableOptions],
        fixed_keys: dict[str, range],
        **kwargs: Any,
    ):
        object.__setattr__(self, "_dynamic_options", dynamic_options)  # read during super init
        object.__setattr__(self, "_fixed_keys", fixed_keys)
        super().__init__(**kwargs)

    def _create_embedding_kernel(self, config, device, pg, sharding_type, env):
        if config.compute_kernel == DYNAMIC_KERNEL:
            return BatchedDynamicEmbeddingBag(
                config, self._dynamic_options, device, sharding_type, self._fixed_keys
            )
        return super()._create_embedding_kernel(config, device, pg, sharding_type, env)

    def prefetch(self, sparse_features, forward_stream=None, *args, **kwargs) -> None:
        _prefetch_dynamic(self, sparse_features, forward_stream)


class DynamicEmbGroupedEmbeddingsLookup(GroupedEmbeddingsLookup):
    """TorchRec's sequence lookup; CUSTOMIZED_KERNEL groups get BatchedDynamicEmbedding."""

    def __init__(
        self,
        dynamic_options: dict[str, DynamicEmbTableOptions],
        fixed_keys: dict[str, range],
        **kwargs: Any,
    ):
        object.__setattr__(self, "_dynamic_options", dynamic_options)
        object.__setattr__(self, "_fixed_keys", fixed_keys)
        super().__init__(**kwargs)

    def _create_embedding_kernel(self, config, pg, device, env=None):
        if config.compute_kernel == DYNAMIC_KERNEL:
            return BatchedDynamicEmbedding(config, self._dynamic_options, device, self._fixed_keys)
        return super()._create_embedding_kernel(config, pg, device, env)

    def prefetch(self, sparse_features, forward_stream=None, *args, **kwargs) -> None:
        _prefetch_dynamic(self, sparse_features, forward_stream)


def _prefetch_dynamic(lookup, sparse_features, forward_stream) -> None:
    """TorchRec's lookup prefetch hook (ShardedModule.prefetch): each dynamic kernel
    prefetches its features (caching mode); ordinary kernels are left alone.
    ``forward_stream`` (TorchRec's prefetch pipeline: its default stream) waits for
    the prefetch."""
    # TorchRec's GroupedEmbeddingsLookup keeps its splits and kernels private.
    groups = sparse_features.split(lookup._feature_splits)  # noqa: SLF001 - no public accessor
    kernels = lookup._emb_modules  # noqa: SLF001 - no public accessor in TorchRec
    for emb_op, features in zip(kernels, groups, strict=True):
        if isinstance(emb_op, (BatchedDynamicEmbedding, BatchedDynamicEmbeddingBag)):
            emb_op.prefetch(features, forward_stream)
