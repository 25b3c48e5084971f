"""ShardedEmbeddingBagCollection / ShardedEmbeddingCollection whose dynamic tables are ours.

Only two things change from TorchRec's modules: the ROW_WISE, TABLE_WISE,
COLUMN_WISE and (EBC) TABLE_ROW_WISE shardings that hold dynamic tables are ours
(row-wise and table-row-wise: routing + kernels; table-wise and column-wise:
kernels), and each dynamic table shows a small
placeholder buffer ``<collection>.<table>.weight`` in ``state_dict()`` (TorchRec
skips CUSTOMIZED_KERNEL tables there). It is a buffer, not a parameter, so
``model.parameters()`` never holds dynamic tables; the rows themselves are saved by
dynemb's dump / load. An ordinary table held as a dynamic one (the planner's
``ordinary_tables_as_dynamic``) shows its rows instead (``ordinary_state.py``).
"""

import torch
from torch import nn
from torchrec.distributed.embedding import ShardedEmbeddingCollection
from torchrec.distributed.embedding_types import EmbeddingComputeKernel, KJTList
from torchrec.distributed.embeddingbag import ShardedEmbeddingBagCollection
from torchrec.distributed.types import ShardingType
from torchrec.modules.embedding_configs import PoolingType
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from dynemb.distributed.sharding_names import POOLED_ONLY_SHARDING_TYPES
from dynemb.shard.compute_kernel import _DynamicKernel
from dynemb.shard.cw_sharding import (
    DynamicEmbCwPooledEmbeddingSharding,
    DynamicEmbCwSequenceEmbeddingSharding,
)
from dynemb.shard.hot_dist import HotRwSparseFeaturesDist, HotSharding
from dynemb.shard.mean_divisor import divided_columns, exact_divisor
from dynemb.shard.ordinary_state import OrdinaryTableState
from dynemb.shard.output_dist import EmptyBatchSafeAwaitable
from dynemb.shard.rw_sharding import (
    DynamicEmbRwPooledEmbeddingSharding,
    DynamicEmbRwSequenceEmbeddingSharding,
    check_sharding_type,
)
from dynemb.shard.tw_sharding import (
    DynamicEmbTwPooledEmbeddingSharding,
    DynamicEmbTwSequenceEmbeddingSharding,
)
from dynemb.shard.twrw_sharding import DynamicEmbTwRwPooledEmbeddingSharding
from dynemb.table_groups import table_groups
from dynemb.tbe.batched_dynamic_embedding_tables import BatchedDynamicEmbeddingTables

_TABLE_WISE = ShardingType.TABLE_WISE.value


def _skipping_dynamic(module, configs_attr: str, run):
    """Runs ``run`` while ``module.<configs_attr>`` lists the ordinary tables only.

    For TorchRec's reset_parameters (dynamic tables have no weight to initialise:
    their rows are made on first sight) and its first-batch id range check (raw ids
    of dynamic tables are meant to exceed num_embeddings)."""
    configs = getattr(module, configs_attr)
    plan = module.module_sharding_plan
    dynamic = EmbeddingComputeKernel.CUSTOMIZED_KERNEL.value
    setattr(module, configs_attr, [c for c in configs if plan[c.name].compute_kernel != dynamic])
    try:
        return run()
    finally:
        setattr(module, configs_attr, configs)


def _reset_ordinary_rows(plan, configs, lookups, device) -> None:
    """TorchRec's reset_parameters for ordinary tables held as dynamic ones: each
    config's ``init_fn`` on this rank's block of rows (as TorchRec on a shard)."""
    if device is not None and device.type == "meta":  # as TorchRec
        return
    init_fns = {
        c.name: c.init_fn
        for c in configs
        if getattr(plan[c.name], "ordinary_table", False) and c.init_fn is not None
    }
    if init_fns:
        for kernel in _dynamic_kernels(lookups):
            kernel.reset_ordinary_rows(init_fns)


def _dynamic_kernels(lookups) -> list[_DynamicKernel]:
    # The kernels (their placeholders, ordinary rows), from lookups TorchRec keeps in a
    # plain list that nn.Module.modules() does not reach.
    kernels = []
    for lookup in lookups:
        module = getattr(lookup, "module", lookup)  # unwrap DistributedDataParallel
        kernels.extend(m for m in module.modules() if isinstance(m, _DynamicKernel))
    return kernels


def _lookup_groups(lookups) -> list[tuple[str, BatchedDynamicEmbeddingTables]]:
    # TorchRec keeps lookups in a plain list, out of nn.Module.modules()' reach: each
    # is walked, and its groups belong to the collection itself (path "").
    return [("", group) for lookup in lookups for _, group in table_groups(lookup)]


def _hot_shardings(input_dists) -> list[HotSharding]:
    return [d.hot_sharding for d in input_dists if isinstance(d, HotRwSparseFeaturesDist)]


def dynamic_embedding_tables(model: nn.Module) -> dict[str, BatchedDynamicEmbeddingTables]:
    """Every group of dynamic tables of this rank, by ``<module path>.<first table name>``.

    Example::

        for path, tables in dynamic_embedding_tables(dmp_model).items():
            print(path, tables.table_names, [t.size() for t in tables.tables])
    """
    found = {}
    for path, tables in table_groups(model):
        found[f"{path}.{tables.table_names[0]}" if path else tables.table_names[0]] = tables
    return found


def _register_placeholders(lookups, tables: nn.ModuleDict, plan, pg) -> None:
    """``<collection>.<table>.weight`` of each dynamic table: a placeholder buffer, or
    for an ordinary table held as a dynamic one its rows (OrdinaryTableState)."""
    for kernel in _dynamic_kernels(lookups):
        ordinary = kernel.ordinary_tables()
        for key, tensor in kernel.placeholders.items():
            name = key[: -len(".weight")]
            if name not in ordinary:
                tables[name].register_buffer("weight", tensor)
        for config in kernel.config.embedding_tables:
            if config.name in ordinary:
                shape = (config.num_embeddings, config.embedding_dim)
                spec = plan[config.name].sharding_spec
                if spec is None:
                    raise ValueError(
                        f"table {config.name!r}: an ordinary table held as a dynamic one needs "
                        "its plan entry's row-wise sharding_spec (plan with the planner)"
                    )
                shards = spec.shards
                tables[config.name] = OrdinaryTableState(kernel, config.name, shape, shards, pg)


def _empty_bags(features: KeyedJaggedTensor, stride: int) -> KeyedJaggedTensor:
    keys = features.keys()
    lengths = torch.zeros(
        len(keys) * stride, dtype=features.lengths().dtype, device=features.device()
    )
    return KeyedJaggedTensor(keys=keys, values=features.values(), lengths=lengths, stride=stride)


class ShardedDynamicEmbeddingBagCollection(ShardedEmbeddingBagCollection):
    """TorchRec's sharded EBC with dynamic tables (built by DynamicEmbeddingBagCollectionSharder)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        # TorchRec's MEAN callback divides only the row-wise MEAN columns exactly
        # (mean_divisor.py): table-wise and column-wise MEAN tables pool in their kernel.
        self._divided_columns = None
        if self._has_mean_pooling_callback:
            self._divided_columns = divided_columns(
                self._embedding_names,
                self._embedding_dims,
                self._pooling_type_to_rs_features[PoolingType.MEAN.value],
            )

    @classmethod
    def create_embedding_bag_sharding(
        cls, sharding_infos, env, device=None, permute_embeddings=False, qcomm_codecs_registry=None
    ):
        sharding_type = sharding_infos[0].param_sharding.sharding_type
        if check_sharding_type(sharding_type, sharding_infos):
            if sharding_type == ShardingType.COLUMN_WISE.value:
                return DynamicEmbCwPooledEmbeddingSharding(
                    sharding_infos, env, device, permute_embeddings, qcomm_codecs_registry
                )
            cls_ = {
                _TABLE_WISE: DynamicEmbTwPooledEmbeddingSharding,
                ShardingType.TABLE_ROW_WISE.value: DynamicEmbTwRwPooledEmbeddingSharding,
            }.get(sharding_type, DynamicEmbRwPooledEmbeddingSharding)
            return cls_(sharding_infos, env, device, qcomm_codecs_registry=qcomm_codecs_registry)
        return super().create_embedding_bag_sharding(
            sharding_infos, env, device, permute_embeddings, qcomm_codecs_registry
        )

    def dynamic_table_groups(self) -> list[tuple[str, BatchedDynamicEmbeddingTables]]:
        """The groups of dynamic tables of this rank (dynemb.table_groups' protocol)."""
        return _lookup_groups(self._lookups)

    def hot_shardings(self) -> list[HotSharding]:
        """The hot keys of its row-wise shardings (``hot_replicas``; dynemb.shard.hot_dist)."""
        return _hot_shardings(self._input_dists)

    def _initialize_torch_state(self, skip_registering: bool = False) -> None:
        super()._initialize_torch_state(skip_registering)
        _register_placeholders(
            self._lookups, self.embedding_bags, self.module_sharding_plan, self._env.process_group
        )

    def reset_parameters(self) -> None:
        _skipping_dynamic(self, "_embedding_bag_configs", super().reset_parameters)
        _reset_ordinary_rows(
            self.module_sharding_plan, self._embedding_bag_configs, self._lookups, self._device
        )

    def input_dist(self, ctx, features):
        if self._has_uninitialized_input_dist:  # its id range check: ordinary tables only
            return _skipping_dynamic(
                self, "_embedding_bag_configs", lambda: self._input_dist(ctx, features)
            )
        return self._input_dist(ctx, features)

    def _input_dist(self, ctx, features):
        # TorchRec's MEAN callback reshapes lengths by stride() and fails on an empty
        # batch; an empty batch has nothing to divide, so the divisor is 1.
        if not self._has_mean_pooling_callback or features.stride() != 0:
            awaitable = super().input_dist(ctx, features)
            if self._divided_columns is not None:
                ctx.divisor = exact_divisor(ctx.divisor, self._divided_columns)
            return awaitable
        first = self._has_uninitialized_input_dist
        self._has_mean_pooling_callback = False
        try:
            awaitable = super().input_dist(ctx, features)
        finally:
            self._has_mean_pooling_callback = True
        if first:
            self._init_mean_pooling_callback(features.keys(), ctx.inverse_indices)
        ctx.divisor = torch.ones(1, device=features.device())
        return awaitable


class ShardedDynamicEmbeddingCollection(ShardedEmbeddingCollection):
    """TorchRec's sharded EC with dynamic tables (built by DynamicEmbeddingCollectionSharder)."""

    @classmethod
    def create_embedding_sharding(
        cls, sharding_type, sharding_infos, env, device=None, qcomm_codecs_registry=None
    ):
        if check_sharding_type(sharding_type, sharding_infos):
            if sharding_type in POOLED_ONLY_SHARDING_TYPES:
                names = [i.embedding_config.name for i in sharding_infos]
                raise ValueError(
                    f"tables {names} of an EmbeddingCollection are planned {sharding_type!r}: "
                    "TorchRec has no table-row-wise sharding for sequence tables; plan them "
                    "row_wise, table_wise or column_wise"
                )
            if sharding_type == ShardingType.COLUMN_WISE.value:
                return DynamicEmbCwSequenceEmbeddingSharding(
                    sharding_infos, env, device, qcomm_codecs_registry=qcomm_codecs_registry
                )
            cls_ = (
                DynamicEmbTwSequenceEmbeddingSharding
                if sharding_type == _TABLE_WISE
                else DynamicEmbRwSequenceEmbeddingSharding
            )
            return cls_(sharding_infos, env, device, qcomm_codecs_registry=qcomm_codecs_registry)
        return super().create_embedding_sharding(
            sharding_type, sharding_infos, env, device, qcomm_codecs_registry
        )

    def dynamic_table_groups(self) -> list[tuple[str, BatchedDynamicEmbeddingTables]]:
        """The groups of dynamic tables of this rank (dynemb.table_groups' protocol)."""
        return _lookup_groups(self._lookups)

    def hot_shardings(self) -> list[HotSharding]:
        """The hot keys of its row-wise shardings (``hot_replicas``; dynemb.shard.hot_dist)."""
        return _hot_shardings(self._input_dists)

    def _initialize_torch_state(self, skip_registering: bool = False) -> None:
        super()._initialize_torch_state(skip_registering)
        _register_placeholders(
            self._lookups, self.embeddings, self.module_sharding_plan, self._env.process_group
        )

    def reset_parameters(self) -> None:
        _skipping_dynamic(self, "_embedding_configs", super().reset_parameters)
        _reset_ordinary_rows(
            self.module_sharding_plan, self._embedding_configs, self._lookups, self._device
        )

    def _create_lookups(self) -> None:
        super()._create_lookups()
        if self._use_index_dedup:  # _dedup_indices sends access counts as weights
            for kernel in _dynamic_kernels(self._lookups):
                kernel.access_counts_in_weights = True
            for sharding in self._sharding_type_to_sharding.values():
                if isinstance(sharding, DynamicEmbRwSequenceEmbeddingSharding):
                    sharding.count_accesses_in_weights()

    def _dedup_indices(self, ctx, input_feature_splits):
        """``use_index_dedup``: one lookup per distinct id of each table, exact for raw ids.

        TorchRec's dedup offsets ids by the tables' num_embeddings, so ids beyond it (or
        negative) of two tables could collide; here each table's ids are deduplicated
        apart. The distinct ids go to the table's first feature (routing is per table),
        and ``reverse_indices`` puts the rows back in input order after the lookup.

        The access counts are kept: a sharding holding dynamic tables sends each
        distinct id's occurrences as its KJT weight (float32, exact up to 2**24 per id
        and batch; TorchRec's input dist carries float weights through its
        all-to-all), which the dynamic kernels give their tables as ``access_counts``
        (LFU scores and admission counters then count as without dedup). Other
        shardings send no weights, as before.
        """
        if any(f.variable_stride_per_key() for f in input_feature_splits):
            # Unreached from input_dist (TorchRec pads variable batch sizes first);
            # TorchRec's dedup (a CUDA op) sends no counts: one access per distinct id.
            return super()._dedup_indices(ctx, input_feature_splits)
        deduped = []
        for features, sharding in zip(
            input_feature_splits, self._sharding_type_to_sharding.values()
        ):
            stride, per_key = features.stride(), features.length_per_key()
            values = features.values()
            lengths = torch.zeros(len(per_key) * stride, dtype=torch.int64, device=values.device)
            uniques, reverse, counts = [], [], []
            feature = position = base = 0
            for table in sharding.embedding_tables():
                count = sum(per_key[feature : feature + table.num_features()])
                unique, inverse, occurrences = torch.unique(
                    values[position : position + count], return_inverse=True, return_counts=True
                )
                uniques.append(unique)
                reverse.append(inverse + base)
                counts.append(occurrences)
                if stride:
                    lengths[feature * stride] = unique.numel()
                feature += table.num_features()
                position += count
                base += unique.numel()
            weights = None
            if isinstance(
                sharding,
                (
                    DynamicEmbRwSequenceEmbeddingSharding,
                    DynamicEmbTwSequenceEmbeddingSharding,
                    DynamicEmbCwSequenceEmbeddingSharding,
                ),
            ):
                weights = (torch.cat(counts) if counts else values[:0]).to(torch.float32)
            deduped.append(
                KeyedJaggedTensor(
                    keys=features.keys(),
                    values=torch.cat(uniques) if uniques else values[:0],
                    weights=weights,
                    lengths=lengths,
                    stride=stride,
                )
            )
            ctx.input_features.append(features)
            ctx.reverse_indices.append(torch.cat(reverse) if reverse else values[:0])
        return deduped

    def output_dist(self, ctx, output):
        return EmptyBatchSafeAwaitable(super().output_dist(ctx, output))

    def compute_and_output_dist(self, ctx, input):
        # When every rank's batch is empty, the routed KJTs have stride 0, which
        # TorchRec's EC reshapes by; one empty bag per rank and feature is the same lookup.
        if any(f.stride() == 0 for f in input):
            ranks = self._env.world_size
            input = KJTList([_empty_bags(f, ranks) if f.stride() == 0 else f for f in input])
        return EmptyBatchSafeAwaitable(super().compute_and_output_dist(ctx, input))


__all__ = [
    "ShardedDynamicEmbeddingBagCollection",
    "ShardedDynamicEmbeddingCollection",
    "dynamic_embedding_tables",
]
