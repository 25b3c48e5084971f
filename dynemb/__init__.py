"""dynemb: dynamic (hash-table) embeddings for TorchRec, on CPU and GPU.

The public API mirrors NVIDIA DynamicEmb: replace ``import dynamicemb`` with
``import dynemb``. See DynamicEmb_APIs.md.
"""

from dynemb.dynamicemb_config import DynamicEmbInitializerArgs
from dynemb.table.scored_hash_table import BatchStats, ScoredHashTable
from dynemb.types import (
    DynamicEmbCheckMode,
    DynamicEmbInitializerMode,
    DynamicEmbPoolingMode,
    DynamicEmbScoreStrategy,
)

__all__ = [
    "BatchStats",
    "DynamicEmbCheckMode",
    "DynamicEmbInitializerArgs",
    "DynamicEmbInitializerMode",
    "DynamicEmbPoolingMode",
    "DynamicEmbScoreStrategy",
    "ScoredHashTable",
]
