"""How TorchRec names dynemb's kernel and sharding, defined once.

TorchRec passes compute kernels as ``EmbeddingComputeKernel`` members in its grouped
configs and as their string values in sharding options and plans.
"""

from torchrec.distributed.embedding_types import EmbeddingComputeKernel
from torchrec.distributed.types import ShardingType

DYNAMIC_KERNEL = EmbeddingComputeKernel.CUSTOMIZED_KERNEL
"""A dynamic table's compute kernel (the member, as in GroupedEmbeddingConfig)."""

DYNAMIC_KERNEL_NAME = DYNAMIC_KERNEL.value
"""Its string, as in the planner's options and ParameterSharding."""

DYNAMIC_SHARDING_TYPE = ShardingType.ROW_WISE.value
"""A dynamic table's default sharding type (string, as in ParameterSharding)."""

DYNAMIC_SHARDING_TYPES = (DYNAMIC_SHARDING_TYPE, ShardingType.TABLE_WISE.value)
"""Every sharding type a dynamic table can have: row-wise (keys routed to their owner
over all ranks) and table-wise (the whole table on one rank)."""

__all__ = [
    "DYNAMIC_KERNEL",
    "DYNAMIC_KERNEL_NAME",
    "DYNAMIC_SHARDING_TYPE",
    "DYNAMIC_SHARDING_TYPES",
]
