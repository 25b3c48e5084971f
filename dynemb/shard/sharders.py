"""The EBC / EC sharders: TorchRec's, plus ROW_WISE (and, EBC, TABLE_ROW_WISE) on cpu
and the dynamic kernel (row-wise, table-wise, column-wise and, EBC, table-row-wise)."""

import torch
from fbgemm_gpu.split_embedding_configs import EmbOptimType
from torchrec.distributed.embedding import EmbeddingCollectionSharder
from torchrec.distributed.embedding_types import EmbeddingComputeKernel
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.types import ShardingType

from dynemb.distributed.sharding_names import DYNAMIC_KERNEL_NAME, DYNAMIC_SHARDING_TYPES
from dynemb.shard.sharded_modules import (
    ShardedDynamicEmbeddingBagCollection,
    ShardedDynamicEmbeddingCollection,
)

# What fbgemm's CPU kernel (TorchRec's FUSED tables on CPU) runs; it asserts on others.
_FBGEMM_CPU_OPTIMIZERS = (
    EmbOptimType.EXACT_SGD,
    EmbOptimType.EXACT_ADAGRAD,
    EmbOptimType.EXACT_ROWWISE_ADAGRAD,
    EmbOptimType.EMAINPLACE_ROWWISE_ADAGRAD,
)
_FBGEMM_KERNELS = {
    EmbeddingComputeKernel.FUSED.value,
    EmbeddingComputeKernel.FUSED_UVM.value,
    EmbeddingComputeKernel.FUSED_UVM_CACHING.value,
}


def check_cpu_optimizer(fused_params, params, device) -> None:
    """Raises ValueError, naming the tables, when ordinary tables would get a fused
    optimizer that fbgemm's CPU kernel lacks (e.g. Adam); points at the planner's
    ``ordinary_tables_as_dynamic``, which gives them dynemb's kernel instead."""
    optimizer = (fused_params or {}).get("optimizer")
    if optimizer is None or optimizer in _FBGEMM_CPU_OPTIMIZERS:
        return
    if torch.device(device if device is not None else "cpu").type != "cpu":
        return
    tables = sorted(n for n, ps in params.items() if ps.compute_kernel in _FBGEMM_KERNELS)
    if tables:
        raise ValueError(
            f"ordinary tables {tables} cannot train with optimizer {optimizer.name} on CPU: "
            "TorchRec's CPU kernel for them has no such optimizer (fbgemm runs "
            f"{', '.join(o.name for o in _FBGEMM_CPU_OPTIMIZERS)}). Plan with "
            "DynamicEmbeddingShardingPlanner(..., ordinary_tables_as_dynamic=True) to "
            "shard them with dynemb's kernel, which runs it"
        )


def _sharding_types(types: list[str], extra: tuple[str, ...]) -> list[str]:
    # TorchRec offers ROW_WISE (and TABLE_ROW_WISE) on cuda only; their machinery runs
    # over gloo too.
    return types + [t for t in extra if t not in types]


def _compute_kernels(kernels: list[str], sharding_type: str, dynamic_types) -> list[str]:
    if sharding_type in dynamic_types:
        return kernels + [DYNAMIC_KERNEL_NAME]
    return kernels


_POOLED_TYPES = (ShardingType.ROW_WISE.value, ShardingType.TABLE_ROW_WISE.value)
_SEQUENCE_TYPES = (ShardingType.ROW_WISE.value,)  # TorchRec has no TWRW for sequence tables


class DynamicEmbeddingBagCollectionSharder(EmbeddingBagCollectionSharder):
    """Drop-in for TorchRec's EmbeddingBagCollectionSharder (same arguments).

    ``fused_params`` carries the dynamic tables' optimizer: ``optimizer`` (an
    ``EmbOptimType`` from ``dynemb.optimizer``), ``learning_rate``, ``eps``, ``beta1``,
    ``beta2``, ``weight_decay``, plus ``output_dtype`` (a ``SparseType``); ordinary
    tables read them as TorchRec does.
    """

    def shard(self, module, params, env, device=None, module_fqn=None):
        check_cpu_optimizer(self.fused_params, params, device)
        return ShardedDynamicEmbeddingBagCollection(
            module=module,
            table_name_to_parameter_sharding=params,
            env=env,
            fused_params=self.fused_params,
            device=device,
            qcomm_codecs_registry=self.qcomm_codecs_registry,
            module_fqn=module_fqn,
            sharded_module_order_overwrite=self._sharded_module_order_overwrite,
        )

    def sharding_types(self, compute_device_type: str) -> list[str]:
        return _sharding_types(super().sharding_types(compute_device_type), _POOLED_TYPES)

    def compute_kernels(self, sharding_type: str, compute_device_type: str) -> list[str]:
        return _compute_kernels(
            super().compute_kernels(sharding_type, compute_device_type),
            sharding_type,
            DYNAMIC_SHARDING_TYPES,
        )


class DynamicEmbeddingCollectionSharder(EmbeddingCollectionSharder):
    """Drop-in for TorchRec's EmbeddingCollectionSharder (same arguments, including
    ``use_index_dedup``; ``fused_params`` as for DynamicEmbeddingBagCollectionSharder)."""

    def shard(self, module, params, env, device=None, module_fqn=None):
        check_cpu_optimizer(self.fused_params, params, device)
        return ShardedDynamicEmbeddingCollection(
            module,
            params,
            env,
            self.fused_params,
            device,
            qcomm_codecs_registry=self.qcomm_codecs_registry,
            use_index_dedup=self._use_index_dedup,
            module_fqn=module_fqn,
        )

    def sharding_types(self, compute_device_type: str) -> list[str]:
        return _sharding_types(super().sharding_types(compute_device_type), _SEQUENCE_TYPES)

    def compute_kernels(self, sharding_type: str, compute_device_type: str) -> list[str]:
        return _compute_kernels(
            super().compute_kernels(sharding_type, compute_device_type),
            sharding_type,
            DYNAMIC_SHARDING_TYPES,
        )
