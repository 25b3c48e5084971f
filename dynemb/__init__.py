"""dynemb: dynamic (hash-table) embeddings for TorchRec, on CPU and GPU.

The public API mirrors NVIDIA DynamicEmb: replace ``import dynamicemb`` with
``import dynemb``. See DynamicEmb_APIs.md.
"""

from dynemb._ops import executor
from dynemb.admission import AdmissionStrategy, Counter, FrequencyAdmissionStrategy, KVCounter
from dynemb.checkpoint import CheckpointError, DynamicEmbDump, DynamicEmbLoad
from dynemb.dynamicemb_config import DynamicEmbInitializerArgs, DynamicEmbTableOptions
from dynemb.kernel.batched_dynamic_embedding_tables import BatchedDynamicEmbeddingTables
from dynemb.table.scored_hash_table import BatchStats, ScoredHashTable
from dynemb.tiering import Storage
from dynemb.types import (
    DynamicEmbCheckMode,
    DynamicEmbInitializerMode,
    DynamicEmbPoolingMode,
    DynamicEmbScoreStrategy,
)

__all__ = [
    "AdmissionStrategy",
    "BatchedDynamicEmbeddingTables",
    "BatchStats",
    "CheckpointError",
    "Counter",
    "DynamicEmbCheckMode",
    "DynamicEmbDump",
    "DynamicEmbInitializerArgs",
    "DynamicEmbInitializerMode",
    "DynamicEmbLoad",
    "DynamicEmbPoolingMode",
    "DynamicEmbScoreStrategy",
    "DynamicEmbTableOptions",
    "FrequencyAdmissionStrategy",
    "KVCounter",
    "ScoredHashTable",
    "Storage",
    "executor",
]
