"""dynemb: dynamic (hash-table) embeddings for TorchRec, on CPU and GPU.

The public API mirrors NVIDIA DynamicEmb: replace ``import dynamicemb`` with
``import dynemb``. See DynamicEmb_APIs.md.
"""

# DynamicEmb's module paths reachable as attributes after ``import dynemb`` alone
# (``dynemb.optimizer.EmbOptimType``).
from dynemb import batched_dynamicemb_tables, optimizer, shard  # noqa: F401
from dynemb._ops import executor
from dynemb.admission_strategies import (
    AdmissionStrategy,
    Counter,
    FrequencyAdmissionStrategy,
    KVCounter,
    ProbabilisticAdmissionStrategy,
)
from dynemb.checkpoint import CheckpointError, DynamicEmbDump, DynamicEmbLoad, RankFailure
from dynemb.config.optimizer import DynamicEmbOptimType, EmbOptimType, OptimizerArgs
from dynemb.config.score_strategies import decayed_count
from dynemb.dynamicemb_config import (
    BATCH_SIZE_PER_DUMP,
    DynamicEmbInitializerArgs,
    DynamicEmbTableOptions,
    ScoreStrategy,
)
from dynemb.eviction_rules import EvictionRule, erase_stale, erased_mark, erased_since
from dynemb.planner.capacity import (
    BUCKET_ALIGNMENT,
    DEMB_TABLE_ALIGN_SIZE,
    MAX_BUCKET_CAPACITY,
    align_to_table_size,
    get_sharded_table_capacity,
    get_table_value_bytes,
)
from dynemb.table.scored_hash_table import BatchStats, ScoredHashTable
from dynemb.table.upsert_counts import TableTelemetry
from dynemb.tbe.batched_dynamic_embedding_tables import BatchedDynamicEmbeddingTables
from dynemb.telemetry import DynamicEmbTelemetry, table_telemetry
from dynemb.tiering import Storage
from dynemb.types import (
    DynamicEmbCheckMode,
    DynamicEmbEvictStrategy,
    DynamicEmbInitializerMode,
    DynamicEmbPoolingMode,
    DynamicEmbScoreStrategy,
)
from dynemb.utils import (
    data_type_to_dtype,
    data_type_to_dyn_emb,
    dyn_emb_to_torch,
    string_to_evict_strategy,
    torch_to_dyn_emb,
)
from dynemb.warm_start import WarmStart

__all__ = [
    "BATCH_SIZE_PER_DUMP",
    "BUCKET_ALIGNMENT",
    "DEMB_TABLE_ALIGN_SIZE",
    "MAX_BUCKET_CAPACITY",
    "AdmissionStrategy",
    "BatchedDynamicEmbeddingTables",
    "BatchStats",
    "CheckpointError",
    "Counter",
    "DynamicEmbCheckMode",
    "DynamicEmbDump",
    "DynamicEmbEvictStrategy",
    "DynamicEmbInitializerArgs",
    "DynamicEmbInitializerMode",
    "DynamicEmbLoad",
    "DynamicEmbOptimType",
    "DynamicEmbPoolingMode",
    "DynamicEmbScoreStrategy",
    "DynamicEmbTableOptions",
    "DynamicEmbTelemetry",
    "EmbOptimType",
    "EvictionRule",
    "FrequencyAdmissionStrategy",
    "KVCounter",
    "OptimizerArgs",
    "ProbabilisticAdmissionStrategy",
    "RankFailure",
    "ScoreStrategy",
    "ScoredHashTable",
    "Storage",
    "TableTelemetry",
    "WarmStart",
    "erase_stale",
    "erased_mark",
    "erased_since",
    "executor",
    "align_to_table_size",
    "data_type_to_dtype",
    "data_type_to_dyn_emb",
    "decayed_count",
    "dyn_emb_to_torch",
    "get_sharded_table_capacity",
    "get_table_value_bytes",
    "string_to_evict_strategy",
    "table_telemetry",
    "torch_to_dyn_emb",
]
