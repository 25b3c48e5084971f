"""TorchRec's EmbeddingEnumerator, offering ROW_WISE / TABLE_WISE / COLUMN_WISE /
TABLE_ROW_WISE + CUSTOMIZED_KERNEL to dynamic tables.

TorchRec's enumerator lists, per table, every (sharding type, compute kernel) the
sharder offers and the constraints allow, then asks its estimators for each
option's perf and storage. Two things change here:

- *Filtering*: a dynamic table gets CUSTOMIZED_KERNEL under each sharding type its
  constraints' ``sharding_types`` list (ROW_WISE, TABLE_WISE, COLUMN_WISE,
  TABLE_ROW_WISE for pooled tables; ROW_WISE alone when unset), so that TorchRec's
  proposers pick among them by cost; other tables never get CUSTOMIZED_KERNEL and, on
  cpu, only the kernels TorchRec's cpu estimators know (DENSE, FUSED, QUANT) unless
  their constraints name kernels, and not TABLE_ROW_WISE (which the sharders add on
  cpu for dynamic tables) unless their constraints name sharding types.
- *Estimates*: TorchRec's estimators do not know CUSTOMIZED_KERNEL. A dynamic option
  is estimated as the TorchRec kernel it behaves like (same row-wise comms, one row
  read per lookup from the tier holding it): FUSED when its values are all in fast
  memory (always on cpu), FUSED_UVM when all on the host, FUSED_UVM_CACHING with
  load factor ``hbm / total`` in between. Its storage is then replaced by the real
  one, shard by shard: ``rank_value_bytes`` (one rank's share of
  ``get_table_value_bytes``: of ``world_size`` ranks row-wise; of the node's
  ``intra_group_size`` ranks table-row-wise; table-wise the whole table; column-wise
  every row at the shard's width) split
  between HBM and DDR by ``memory_budget.dynamic_rank_storage``; a rank whose budget
  cannot hold its row-wise dynamic shards fails here, naming the rank and the tables
  (table-wise, column-wise and table-row-wise shards' ranks, or node, are chosen by
  TorchRec's partitioner, which fails when none can hold them). A table-row-wise
  option's perf is TorchRec's for TWRW: its intra-node and cross-node comms.
"""

import copy
import dataclasses
import logging

import torch
from torchrec.distributed.embedding_types import EmbeddingComputeKernel
from torchrec.distributed.planner.enumerators import EmbeddingEnumerator
from torchrec.distributed.planner.types import (
    ParameterConstraints,
    ShardEstimator,
    ShardingOption,
    Storage,
    Topology,
)
from torchrec.distributed.types import CacheParams, ShardingType
from torchrec.modules.embedding_configs import EmbeddingBagConfig

from dynemb.config.optimizer import EmbOptimType, OptimizerConfig
from dynemb.config.table_options import dtype_to_bytes, hot_replica_rows
from dynemb.distributed.sharding_names import DYNAMIC_KERNEL_NAME, DYNAMIC_SHARDING_TYPE
from dynemb.planner.capacity import effective_bucket_capacity, rank_value_bytes
from dynemb.planner.constraints import DynamicEmbParameterConstraints, is_dynamic
from dynemb.planner.memory_budget import check_rank_budgets, dynamic_rank_storage
from dynemb.planner.rank_options import planner_inputs, table_ranks

__all__ = ["DynamicEmbeddingEnumerator"]

logger = logging.getLogger(__name__)

# Kernels with a cpu entry in TorchRec's bandwidth table (planner/constants.py
# kernel_bw_lookup); its cpu estimators reject the others (uvm, key-value, ...).
CPU_KERNELS = frozenset(
    k.value
    for k in (
        EmbeddingComputeKernel.DENSE,
        EmbeddingComputeKernel.FUSED,
        EmbeddingComputeKernel.QUANT,
    )
)
DYNAMIC_DEVICES = frozenset({"cpu", "cuda"})


class DynamicEmbeddingEnumerator(EmbeddingEnumerator):
    """Sharding options for a module with dynamic and ordinary tables (TorchRec's arguments).

    Tables whose constraints are ``DynamicEmbParameterConstraints(use_dynamicemb=True)``
    get a single option, ROW_WISE with ``EmbeddingComputeKernel.CUSTOMIZED_KERNEL``, on
    cpu and cuda; the sharders must offer it (``dynemb.shard``'s do). Other tables get
    TorchRec's options without CUSTOMIZED_KERNEL; on cpu, without the kernels TorchRec's
    cpu estimators reject (uvm ones) unless their constraints list ``compute_kernels``.

    Args:
        topology: device topology (world size, compute device, memory).
        batch_size: batch size per rank (default 512, as in DynamicEmb).
        constraints: per-table constraints, ``ParameterConstraints`` or
            ``DynamicEmbParameterConstraints``, by table name.
        estimator: perf / storage estimators (TorchRec's defaults when ``None``); dynamic
            options are estimated through them as explained in this module's docstring.
        use_exact_enumerate_order: as in TorchRec.

    Raises (from ``enumerate``):
        ValueError: a dynamic table on a compute device other than cpu / cuda, or whose
            sharder does not offer ROW_WISE / CUSTOMIZED_KERNEL.
        PlannerError: a rank's HBM or DDR (the topology's ``hbm_cap`` / ``ddr_cap``)
            cannot hold its shards of the dynamic tables (INSUFFICIENT_STORAGE).

    Example::

        enumerator = DynamicEmbeddingEnumerator(
            topology=Topology(world_size=2, compute_device="cpu"),
            batch_size=512,
            constraints={"user_id": DynamicEmbParameterConstraints(use_dynamicemb=True)},
        )
        options = enumerator.enumerate(ebc, [DynamicEmbeddingBagCollectionSharder()])
    """

    def __init__(
        self,
        topology: Topology,
        batch_size: int = 512,
        constraints: dict[str, ParameterConstraints] | None = None,
        estimator: ShardEstimator | list[ShardEstimator] | None = None,
        use_exact_enumerate_order: bool | None = False,
    ) -> None:
        self._budget_topology = topology
        super().__init__(
            topology=topology,
            batch_size=batch_size,
            constraints=constraints,
            estimator=estimator,
            use_exact_enumerate_order=use_exact_enumerate_order,
        )

    def _dynamic_constraints(self, name: str) -> DynamicEmbParameterConstraints | None:
        c = (self._constraints or {}).get(name)
        return c if is_dynamic(c) else None

    def _filter_sharding_types(
        self, name: str, allowed_sharding_types: list[str], sharder_key: str = ""
    ) -> list[str]:
        if self._dynamic_constraints(name) is None:
            types = super()._filter_sharding_types(name, allowed_sharding_types, sharder_key)
            c = (self._constraints or {}).get(name)
            if self._compute_device == "cpu" and not (c and c.sharding_types):
                # Offered on cpu for dynamic tables; ordinary ones keep TorchRec's cpu choice.
                types = [t for t in types if t != ShardingType.TABLE_ROW_WISE.value]
            return types
        if self._compute_device not in DYNAMIC_DEVICES:
            raise ValueError(
                f"table {name!r}: dynamic tables run on {sorted(DYNAMIC_DEVICES)}, "
                f"the topology's compute device is {self._compute_device!r}"
            )
        # The constraints' types (checked against DYNAMIC_SHARDING_TYPES by the
        # planner), else row-wise alone, as before table-wise existed.
        wanted = list(self._dynamic_constraints(name).sharding_types or [DYNAMIC_SHARDING_TYPE])
        missing = [t for t in wanted if t not in allowed_sharding_types]
        if missing:
            raise ValueError(
                f"table {name!r} is dynamic but its sharder ({sharder_key}) does not offer "
                f"{missing} on {self._compute_device!r} (it offers "
                f"{allowed_sharding_types}); use the sharders of dynemb.shard"
            )
        return wanted

    def _filter_compute_kernels(
        self, name: str, allowed_compute_kernels: list[str], sharding_type: str
    ) -> list[str]:
        if self._dynamic_constraints(name) is not None:
            if DYNAMIC_KERNEL_NAME not in allowed_compute_kernels:
                raise ValueError(
                    f"table {name!r} is dynamic but its sharder does not offer compute kernel "
                    f"{DYNAMIC_KERNEL_NAME!r} for {sharding_type!r} (it offers "
                    f"{allowed_compute_kernels}); use the sharders of dynemb.shard"
                )
            return [DYNAMIC_KERNEL_NAME]
        allowed = [k for k in allowed_compute_kernels if k != DYNAMIC_KERNEL_NAME]
        c = (self._constraints or {}).get(name)
        if self._compute_device == "cpu" and not (c and c.compute_kernels):
            allowed = [k for k in allowed if k in CPU_KERNELS]
        return super()._filter_compute_kernels(name, allowed, sharding_type)

    def populate_estimates(self, sharding_options: list[ShardingOption]) -> None:
        # Estimate dynamic options as their stand-in kernel (see the module docstring),
        # through shallow copies that share the originals' shards.
        proxies, dynamic = [], []
        for so in sharding_options:
            c = self._dynamic_constraints(so.name)
            if c is None or so.compute_kernel != DYNAMIC_KERNEL_NAME:
                proxies.append(so)
                continue
            storage = self._dynamic_storage(so, c, so.shards[0].size[1])
            proxy = copy.copy(so)
            proxy.compute_kernel, proxy.cache_params = _stand_in_kernel(
                self._compute_device, storage, so.cache_params
            )
            proxies.append(proxy)
            dynamic.append((so, proxy, c))
        super().populate_estimates(proxies)
        for so, proxy, c in dynamic:
            # Keep what the estimators derived (e.g. is_weighted), not the stand-in kernel.
            for key, value in vars(proxy).items():
                if key not in ("compute_kernel", "cache_params"):
                    setattr(so, key, value)
            for shard in so.shards:
                shard.storage = self._dynamic_storage(so, c, shard.size[1])
        # Row-wise shards are on every rank; the others' ranks are the partitioner's.
        check_rank_budgets(
            self._budget_topology,
            [
                (so.name, so.shards[0].storage)
                for so, _, _ in dynamic
                if so.sharding_type == DYNAMIC_SHARDING_TYPE
            ],
        )

    def _dynamic_storage(
        self, so: ShardingOption, c: DynamicEmbParameterConstraints, dim: int
    ) -> Storage:
        """Storage of one shard (``dim`` columns) of a dynamic table's values and
        optimizer state on the rank holding it."""
        o = planner_inputs(c.dynamicemb_options)
        rows, full = so.tensor.shape
        if dim != full:  # a column slice gets its columns' share of the HBM budget
            o = dataclasses.replace(o, global_hbm_for_values=o.global_hbm_for_values * dim // full)
        # A stand-in config from the module's parameter: the planner checks that it
        # agrees with eb_configs.
        config = EmbeddingBagConfig(
            name=so.name,
            num_embeddings=rows,
            embedding_dim=dim,
            feature_names=[],
        )
        ranks = table_ranks(
            so.sharding_type, self._world_size, self._budget_topology.intra_group_size
        )
        bucket = effective_bucket_capacity(rows, ranks, o.bucket_capacity)
        optimizer = self._optimizer(so)
        total = rank_value_bytes(config, optimizer, ranks, bucket, o.embedding_dtype)
        replica = 0
        if o.hot_replicas and so.sharding_type == ShardingType.ROW_WISE.value:
            row = dim + OptimizerConfig(optimizer).state_columns(dim)
            dtype = o.embedding_dtype if o.embedding_dtype is not None else torch.float32
            replica = hot_replica_rows(o) * row * dtype_to_bytes(dtype)
        return dynamic_rank_storage(o, total, self._compute_device, ranks, replica)

    def _optimizer(self, so: ShardingOption) -> EmbOptimType:
        # The dynamic tables' optimizer travels in the sharder's fused_params.
        sharder_data = self._sharder_data_map.get(so.module_type_key)
        fused_params = sharder_data.fused_params if sharder_data else None
        optimizer = (fused_params or {}).get("optimizer")
        return EmbOptimType.EXACT_SGD if optimizer is None else optimizer


def _stand_in_kernel(
    compute_device: str, storage: Storage, cache_params: CacheParams | None
) -> tuple[str, CacheParams | None]:
    """The TorchRec kernel (and cache params) a dynamic table is estimated as."""
    total = storage.hbm + storage.ddr
    if compute_device == "cpu" or storage.ddr == 0:
        return EmbeddingComputeKernel.FUSED.value, cache_params
    if storage.hbm == 0:
        return EmbeddingComputeKernel.FUSED_UVM.value, cache_params
    params = copy.deepcopy(cache_params) or CacheParams()
    params.load_factor = storage.hbm / total
    return EmbeddingComputeKernel.FUSED_UVM_CACHING.value, params
