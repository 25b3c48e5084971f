"""DynamicEmb's ``dynamicemb.types``: the enums of the public API, the element types of a
table (``KEY_TYPE`` ...), the alignment constants, ``CopyMode``, ``DynamicEmbInitializerArgs``
and the abstract ``Storage``, ``Cache``, ``Counter`` and ``AdmissionStrategy``.

A front module: it re-exports names defined in dynemb's packages (the enums and element
types: ``dynemb.config.types``) and no module of dynemb imports it.
"""

from dynemb.admission_strategies import AdmissionStrategy, Counter
from dynemb.config.storage import Storage
from dynemb.config.table_options import DynamicEmbInitializerArgs
from dynemb.config.types import (
    COUNTER_TYPE,
    EMBEDDING_TYPE,
    KEY_TYPE,
    OPT_STATE_TYPE,
    SCORE_TYPE,
    CopyMode,
    DynamicEmbCheckMode,
    DynamicEmbDataType,
    DynamicEmbEvictStrategy,
    DynamicEmbInitializerMode,
    DynamicEmbPoolingMode,
    DynamicEmbScoreStrategy,
    EvictStrategy,
    MemoryType,
)
from dynemb.planner.capacity import BUCKET_ALIGNMENT, DEMB_TABLE_ALIGN_SIZE, MAX_BUCKET_CAPACITY
from dynemb.tiering.cache import Cache

__all__ = [
    "COUNTER_TYPE",
    "EMBEDDING_TYPE",
    "KEY_TYPE",
    "OPT_STATE_TYPE",
    "SCORE_TYPE",
    "CopyMode",
    "DynamicEmbCheckMode",
    "DynamicEmbDataType",
    "DynamicEmbEvictStrategy",
    "DynamicEmbInitializerMode",
    "DynamicEmbPoolingMode",
    "DynamicEmbScoreStrategy",
    "EvictStrategy",
    "MemoryType",
    "AdmissionStrategy",
    "BUCKET_ALIGNMENT",
    "Cache",
    "Counter",
    "DEMB_TABLE_ALIGN_SIZE",
    "DynamicEmbInitializerArgs",
    "MAX_BUCKET_CAPACITY",
    "Storage",
]
