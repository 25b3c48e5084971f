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

DYNAMIC_SHARDING_TYPES = (
    DYNAMIC_SHARDING_TYPE,
    ShardingType.TABLE_WISE.value,
    ShardingType.COLUMN_WISE.value,
    ShardingType.TABLE_ROW_WISE.value,
)
"""Every sharding type a dynamic table can have: row-wise (keys routed to their owner
over all ranks), table-wise (the whole table on one rank), column-wise (a column
slice of every row on each of its ranks) and table-row-wise (keys routed to their
owner over the ranks of one node; pooled tables only)."""

POOLED_ONLY_SHARDING_TYPES = (ShardingType.TABLE_ROW_WISE.value,)
"""The sharding types TorchRec has for pooled (EmbeddingBagCollection) tables only."""

COLUMN_SLICES = "column_wise"
"""The routing (``table_routing``) that a column slice's tables report: every key of
the table is on every rank holding a slice (checkpoints save and load it slice by slice)."""

__all__ = [
    "COLUMN_SLICES",
    "DYNAMIC_KERNEL",
    "DYNAMIC_KERNEL_NAME",
    "DYNAMIC_SHARDING_TYPE",
    "DYNAMIC_SHARDING_TYPES",
    "POOLED_ONLY_SHARDING_TYPES",
]
