"""dynemb: dynamic (hash-table) embeddings for TorchRec, on CPU and GPU.

The public API mirrors NVIDIA DynamicEmb: replace ``import dynamicemb`` with
``import dynemb``. See DynamicEmb_APIs.md.
"""

from dynemb.dynamicemb_config import DynamicEmbInitializerArgs, DynamicEmbTableOptions
from dynemb.kernel.batched_dynamic_embedding_tables import BatchedDynamicEmbeddingTables
from dynemb.table.scored_hash_table import BatchStats, ScoredHashTable
from dynemb.types import (
    DynamicEmbCheckMode,
    DynamicEmbInitializerMode,
    DynamicEmbPoolingMode,
    DynamicEmbScoreStrategy,
)

__all__ = [
    "BatchedDynamicEmbeddingTables",
    "BatchStats",
    "DynamicEmbCheckMode",
    "DynamicEmbInitializerArgs",
    "DynamicEmbInitializerMode",
    "DynamicEmbPoolingMode",
    "DynamicEmbScoreStrategy",
    "DynamicEmbTableOptions",
    "ScoredHashTable",
]
