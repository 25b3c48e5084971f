"""Sharders that put dynamic tables into TorchRec's sharded EBC / EC (names mirror DynamicEmb).

A table whose plan entry is a ``dynemb.planner.DynamicEmbParameterSharding``
(``EmbeddingComputeKernel.CUSTOMIZED_KERNEL``) becomes a dynamic table sharded
row-wise over the ranks (ROW_WISE, ``rw_sharding.py``), whole on one rank
(TABLE_WISE, ``tw_sharding.py``), in column slices (COLUMN_WISE, ``cw_sharding.py``)
or row-wise over the ranks of one node (TABLE_ROW_WISE, pooled tables,
``twrw_sharding.py``); every other table stays TorchRec's.
"""

from dynemb.shard.hot_dist import hot_key_stats, reload_hot_replicas
from dynemb.shard.sharded_modules import (
    ShardedDynamicEmbeddingBagCollection,
    ShardedDynamicEmbeddingCollection,
    dynamic_embedding_tables,
)
from dynemb.shard.sharders import (
    DynamicEmbeddingBagCollectionSharder,
    DynamicEmbeddingCollectionSharder,
)

__all__ = [
    "DynamicEmbeddingBagCollectionSharder",
    "DynamicEmbeddingCollectionSharder",
    "ShardedDynamicEmbeddingBagCollection",
    "ShardedDynamicEmbeddingCollection",
    "dynamic_embedding_tables",
    "hot_key_stats",
    "reload_hot_replicas",
]
