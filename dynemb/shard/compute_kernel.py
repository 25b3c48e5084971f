"""TorchRec kernels over BatchedDynamicEmbeddingTables: what a lookup calls per table group.

``BatchedDynamicEmbeddingBag`` (pooled, EBC) and ``BatchedDynamicEmbedding``
(sequence, EC) turn a group's KeyedJaggedTensor into a TBE call, and expose a
``fused_optimizer`` whose learning rate reaches the tables (TorchRec's fused
optimizer and LR schedulers write ``param_groups[*]["lr"]``).
"""

from collections.abc import Callable
from typing import Any

import torch
from fbgemm_gpu.split_table_batched_embeddings_ops_common import PoolingMode
from torchrec.distributed.embedding_kernel import BaseEmbedding
from torchrec.distributed.embedding_types import GroupedEmbeddingConfig
from torchrec.distributed.types import ShardingType
from torchrec.modules.embedding_configs import pooling_type_to_pooling_mode
from torchrec.optim.fused import FusedOptimizer, FusedOptimizerModule
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from dynemb.config.optimizer import DynamicEmbOptimType, EmbOptimType
from dynemb.config.table_options import DynamicEmbTableOptions
from dynemb.config.types import DynamicEmbPoolingMode
from dynemb.distributed.sharding_names import COLUMN_SLICES
from dynemb.tbe.batched_dynamic_embedding_tables import BatchedDynamicEmbeddingTables
from dynemb.tbe.v2_tables import BatchedDynamicEmbeddingTablesV2

# fused_params keys that are the optimizer's hyper-parameters (TorchRec / fbgemm names).
_OPTIMIZER_KWARGS = (
    "learning_rate", "eps", "beta1", "beta2", "weight_decay",
    # FTRL's (DynamicEmb's names)
    "learning_rate_power", "ftrl_beta", "l1_reg", "l2_reg", "initial_accumulator_value",
)  # fmt: skip
_POOLING = {
    PoolingMode.SUM: DynamicEmbPoolingMode.SUM,
    PoolingMode.MEAN: DynamicEmbPoolingMode.MEAN,
    PoolingMode.NONE: DynamicEmbPoolingMode.NONE,
}


class DynamicEmbFusedOptimizer(FusedOptimizer):
    """The fused optimizer of one group of dynamic tables.

    The update happens inside backward; ``step`` only pushes the param groups'
    learning rate to the tables (the kernel also reads it before every forward,
    so a changed ``lr`` applies from the next backward without calling ``step``).
    ``params`` holds one placeholder tensor per table (the rows live in the tables).
    """

    def __init__(self, tables: BatchedDynamicEmbeddingTables, params: dict[str, torch.Tensor]):
        self._tables = tables
        config = tables.optimizer_config
        group = {
            "params": list(params.values()),
            "lr": config.learning_rate,
            "eps": config.eps,
            "beta1": config.beta1,
            "beta2": config.beta2,
            "weight_decay": config.weight_decay,
            "optimizer": config.optimizer.name,
        }
        super().__init__(params, {p: {} for p in params.values()}, [group])

    def sync(self) -> None:
        self._tables.set_learning_rate(self.param_groups[0]["lr"])

    def step(self, closure: Any = None) -> None:
        self.sync()

    def zero_grad(self, set_to_none: bool = False) -> None:
        pass  # no gradient is ever stored


def _build_tables(
    config: GroupedEmbeddingConfig,
    options_by_table: dict[str, DynamicEmbTableOptions],
    pooling: DynamicEmbPoolingMode,
    device: torch.device | None,
) -> BatchedDynamicEmbeddingTables:
    fused = dict(config.fused_params or {})
    optimizer = fused.get("optimizer", EmbOptimType.EXACT_SGD)
    if not isinstance(optimizer, (EmbOptimType, DynamicEmbOptimType)):
        raise TypeError(
            "fused_params['optimizer'] must be a dynemb.optimizer.EmbOptimType or "
            f"DynamicEmbOptimType, got {optimizer!r}"
        )
    kwargs = {k: fused[k] for k in _OPTIMIZER_KWARGS if k in fused}
    options, feature_table_map, names = [], [], []
    for index, table in enumerate(config.embedding_tables):
        if table.name not in options_by_table:
            raise ValueError(
                f"table {table.name!r} uses the dynamic kernel but its plan entry is not a "
                "DynamicEmbParameterSharding: plan with dynemb.planner.DynamicEmbeddingShardingPlanner"
            )
        opts = options_by_table[table.name]
        width = table.local_cols if table.local_cols is not None else table.embedding_dim
        if opts.dim != width:
            raise ValueError(
                f"table {table.name!r}: dynamicemb_options.dim={opts.dim} but this rank's "
                f"shard of the config has {width} columns"
            )
        options.append(opts)
        names.append(table.name)
        feature_table_map.extend([index] * table.num_features())
    # DynamicEmb's class, so that its members (dump, get_score, ...) are there for users
    # who reach the tables through dynemb.dump_load.get_dynamic_emb_module.
    tables = BatchedDynamicEmbeddingTablesV2(
        options,
        table_names=names,
        feature_table_map=feature_table_map,
        pooling_mode=pooling,
        optimizer=optimizer,
        device=device,
        **kwargs,
    )
    # How keys reach this rank (checkpoint loading re-routes keys with it).
    tables.routing = [
        (o.dist_type, t.num_embeddings) for o, t in zip(options, config.embedding_tables)
    ]
    tables.full_dims = [t.embedding_dim for t in config.embedding_tables]  # checkpoints join slices
    return tables


def _store_rows(
    tables: BatchedDynamicEmbeddingTables,
    config: GroupedEmbeddingConfig,
    fixed_keys: dict[str, range],
    init_fns: dict[str, Callable] | None = None,
) -> None:
    """Stores every row of this rank's block of each ordinary table held as a dynamic one.

    A table's rows are ``init_fns[name]`` applied to the block (TorchRec's
    ``reset_parameters`` applies the config's ``init_fn`` to a shard so); without one,
    they are drawn as TorchRec's CPU kernels draw a shard at construction,
    ``uniform(weight_init_min, weight_init_max)`` from torch's generator.
    """
    for index, table in enumerate(config.embedding_tables):
        keys = fixed_keys.get(table.name)
        if keys is None or (init_fns is not None and table.name not in init_fns):
            continue
        store = tables.tables[index]
        ids = torch.arange(keys.start, keys.stop, dtype=torch.int64, device=store.device)
        rows = torch.empty(len(keys), table.embedding_dim, device=store.device)
        if init_fns is not None:
            init_fns[table.name](rows)
        else:
            torch.nn.init.uniform_(rows, table.get_weight_init_min(), table.get_weight_init_max())
        stats = store.insert_or_assign(ids, rows.to(store.value_dtype))
        if stats.failed or store.size() != len(keys):
            raise RuntimeError(
                f"table {table.name!r}: {stats.failed} of the {len(keys)} rows of ids "
                f"[{keys.start}, {keys.stop}) could not be stored in a table of "
                f"{store.max_capacity()} slots; please report this (a larger "
                "bucket_capacity avoids it)"
            )


class _DynamicKernel(BaseEmbedding, FusedOptimizerModule):
    """What the two kernels share: the tables, the placeholders, the fused optimizer.

    ``access_counts_in_weights``: the features' weights are per-index access counts
    (a de-duplicated batch: ``ShardedDynamicEmbeddingCollection`` with
    ``use_index_dedup`` sends each distinct id once, its count as its weight), given to
    the tables as ``access_counts``; never as per-sample weights.
    """

    access_counts_in_weights: bool = False

    def __init__(
        self,
        config: GroupedEmbeddingConfig,
        options_by_table: dict[str, DynamicEmbTableOptions],
        pooling: DynamicEmbPoolingMode,
        device: torch.device | None = None,
        fixed_keys: dict[str, range] | None = None,
    ) -> None:
        super().__init__()
        self._config = config
        self._emb_module = _build_tables(config, options_by_table, pooling, device)
        self._fixed_keys = fixed_keys or {}
        _store_rows(self._emb_module, config, self._fixed_keys)
        fused = config.fused_params or {}
        output = fused.get("output_dtype")
        self._output_dtype = output.as_dtype() if output is not None else torch.float32
        # One small tensor per table: what state_dict and the optimizer's params show.
        self.placeholders = {
            f"{t.name}.weight": torch.zeros(1, device=device) for t in config.embedding_tables
        }
        self._optim = DynamicEmbFusedOptimizer(self._emb_module, self.placeholders)

    def reset_ordinary_rows(self, init_fns: dict[str, Callable]) -> None:
        """Rewrites the rows of this rank's block of the ordinary tables held here that
        ``init_fns`` names, each with its function (the sharded module's
        ``reset_parameters``, TorchRec's way of applying a config's ``init_fn``)."""
        _store_rows(self._emb_module, self._config, self._fixed_keys, init_fns)

    def ordinary_tables(self) -> list[str]:
        """The ordinary tables held here as dynamic ones."""
        return list(self._fixed_keys)

    def ordinary_block(self, name: str) -> range:
        """This rank's ids of ordinary table ``name`` (all stored)."""
        return self._fixed_keys[name]

    def read_ordinary_rows(self, name: str) -> torch.Tensor:
        """The rows of ``ordinary_block(name)``, in id order: ``(len(block), dim)``."""
        store, ids = self._ordinary_store(name)
        rows, found = store.find(ids)
        if not bool(found.all()):  # never: every id is stored at build and never erased
            raise RuntimeError(f"table {name!r}: {int((~found).sum())} ids of the block missing")
        return rows

    def write_ordinary_rows(self, name: str, rows: torch.Tensor) -> None:
        """Overwrites the rows of ``ordinary_block(name)`` (``(len(block), dim)``); the
        optimizer state is kept, as TorchRec's load_state_dict keeps it."""
        store, ids = self._ordinary_store(name)
        store.insert_or_assign(ids, rows.to(device=store.device, dtype=store.value_dtype))

    def _ordinary_store(self, name: str):
        store = self._emb_module.tables[self._emb_module.table_names.index(name)]
        block = self._fixed_keys[name]
        return store, torch.arange(block.start, block.stop, dtype=torch.int64, device=store.device)

    @property
    def config(self) -> GroupedEmbeddingConfig:
        return self._config

    @property
    def emb_module(self) -> BatchedDynamicEmbeddingTables:
        return self._emb_module

    @property
    def fused_optimizer(self) -> FusedOptimizer:
        return self._optim

    def forward(self, features: KeyedJaggedTensor) -> torch.Tensor:
        self._optim.sync()
        self._emb_module.train(self.training)
        indices, offsets, weights, counts = self._batch(features)
        out = self._emb_module(indices, offsets, weights, access_counts=counts)
        return out if self._output_dtype == torch.float32 else out.to(self._output_dtype)

    def _batch(self, features: KeyedJaggedTensor) -> tuple:
        """``(indices, offsets, per-sample weights or None, access counts or None)``
        of a group's features: float weights are per-sample weights, or the access
        counts under ``access_counts_in_weights`` (integer-valued floats: TorchRec's
        input dist carries float weights)."""
        weights = features.weights_or_none()
        if weights is not None and not torch.is_floating_point(weights):
            weights = None
        counts = None
        if self.access_counts_in_weights:
            counts = None if weights is None else weights.to(torch.int64)
            weights = None
        indices = features.values().to(torch.int64)
        return indices, features.offsets().to(torch.int64), weights, counts

    def prefetch(self, features: KeyedJaggedTensor, forward_stream=None) -> None:
        """Caching mode: brings the keys of a future batch (this kernel's part of its
        input dist) into the caches (BatchedDynamicEmbeddingTables.prefetch; the
        forward's ``forward_stream`` waits for it)."""
        self._emb_module.train(self.training)
        indices, offsets, weights, _ = self._batch(features)  # counts: read by forward
        self._emb_module.prefetch(indices, offsets, weights, forward_stream)

    def state_dict(self, destination=None, prefix: str = "", keep_vars: bool = False):
        # The rows are saved by dynemb's dump; TorchRec's state_dict gets placeholders.
        if destination is None:
            destination = {}
        for key, tensor in self.placeholders.items():
            destination[prefix + key] = tensor
        return destination

    def named_parameters_by_table(self):
        return iter(())  # no parameter: dense optimizers must not see dynamic tables

    def named_split_embedding_weights(self, prefix: str = "", recurse=True, remove_duplicate=True):
        return iter(())

    def split_embedding_weights(self) -> list:
        return []

    def flush(self) -> None:
        pass

    def purge(self) -> None:
        pass


class BatchedDynamicEmbeddingBag(_DynamicKernel):
    """Pooled kernel (EBC). Row-wise MEAN runs as SUM here; TorchRec divides after the
    reduce-scatter, as it does for fbgemm's kernels."""

    def __init__(
        self,
        config,
        options_by_table,
        device=None,
        sharding_type=ShardingType.ROW_WISE,
        fixed_keys=None,
    ):
        mode = pooling_type_to_pooling_mode(config.pooling, sharding_type)
        super().__init__(config, options_by_table, _POOLING[mode], device, fixed_keys)
        if sharding_type == ShardingType.COLUMN_WISE:
            tables = self.emb_module
            tables.routing = [(COLUMN_SLICES, n) for _, n in tables.routing]


class BatchedDynamicEmbedding(_DynamicKernel):
    """Sequence kernel (EC): one row per id."""

    def __init__(self, config, options_by_table, device=None, fixed_keys=None):
        super().__init__(config, options_by_table, DynamicEmbPoolingMode.NONE, device, fixed_keys)
