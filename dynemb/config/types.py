"""Enums of the public API and a table's element types. Names, bases and values mirror
NVIDIA DynamicEmb (``dynemb.types`` re-exports them, with the names ``dynamicemb.types``
has that are defined elsewhere).

``DynamicEmbCheckMode``, ``DynamicEmbPoolingMode`` and ``DynamicEmbScoreStrategy`` are
``IntEnum``s (``DynamicEmbPoolingMode.SUM == 0``); ``DynamicEmbInitializerMode``,
``DynamicEmbEvictStrategy`` and ``MemoryType`` are plain ``Enum``s, with DynamicEmb's
values.
"""

import enum

import torch

KEY_TYPE = torch.int64
"""dtype of a key."""
EMBEDDING_TYPE = torch.float32
"""dtype of an embedding row in DynamicEmb's checkpoints (the default storage dtype)."""
SCORE_TYPE = torch.int64
"""dtype of a score."""
OPT_STATE_TYPE = torch.float32
"""dtype of an optimizer state column in DynamicEmb's checkpoints."""
COUNTER_TYPE = torch.int64
"""dtype of an admission count."""

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
]


class DynamicEmbInitializerMode(enum.Enum):
    """How a new key's embedding row is initialised (see DynamicEmbInitializerArgs).

    Every mode is a function of (seed, key, column): the same key gets the same row
    whatever the batch order, thread count, device or world size.

    DEBUG writes ``float(key mod 100000)`` (the key read as unsigned 64-bit) in every
    column, as DynamicEmb does.
    """

    NORMAL = "normal"
    TRUNCATED_NORMAL = "truncated_normal"
    UNIFORM = "uniform"
    CONSTANT = "constant"
    DEBUG = "debug"


class DynamicEmbScoreStrategy(enum.IntEnum):
    """What a key's score is; in a full bucket the smallest score is evicted (ties:
    the smaller key digest, then the smaller key).

    TIMESTAMP: monotonic time (ns) of the batch that last accessed the key.
    STEP: the table's batch counter at the last access (one step per upsert batch).
    CUSTOMIZED: the caller's score; a new key scoring below every resident of its
        full bucket is refused (reported as failed) rather than evicting.
    LFU: number of accesses (each occurrence in a batch counts).
    NO_EVICTION: no score is kept; the table grows up to its max capacity, then
        inserts fail and are reported.
    DECAYED_LFU: the access count decayed by elapsed training steps, halved every
        ``DynamicEmbTableOptions.score_half_life_steps`` steps (dynemb only; stored
        as ``step + half_life * log2(count)`` in units of 2**-16 step, see
        ``dynemb.decayed_count``).
    The compounds ``(TIMESTAMP, LFU)`` and ``(TIMESTAMP, DECAYED_LFU)`` evict by the
    (decayed) count and keep the last-access time beside it.
    """

    TIMESTAMP = 0
    STEP = 1
    CUSTOMIZED = 2
    LFU = 3
    NO_EVICTION = 4
    DECAYED_LFU = 7  # the core's code (5 and 6 are internal: a compound, a cache tier)


class DynamicEmbCheckMode(enum.IntEnum):
    """What a lookup does with keys that could not be stored (safe-check)."""

    ERROR = 0
    WARNING = 1
    IGNORE = 2


class DynamicEmbPoolingMode(enum.IntEnum):
    """Pooling of BatchedDynamicEmbeddingTables; NONE returns one row per index."""

    SUM = 0
    MEAN = 1
    NONE = 2


class EvictStrategy(enum.Enum):
    """The eviction policy codes that ``DynamicEmbEvictStrategy`` members hold as values.

    DynamicEmb's are a C++ (pybind) enum; ``str(EvictStrategy.KLru)`` is
    ``"EvictStrategy.KLru"`` in both, the spelling DynamicEmb's checkpoints record.
    """

    KLru = 0
    KLfu = 1
    KEpochLru = 2
    KEpochLfu = 3
    KCustomized = 4


class DynamicEmbEvictStrategy(enum.Enum):
    """DynamicEmb's eviction policy names. In dynemb the ``score_strategy`` decides the
    eviction (see DynamicEmbTableOptions.evict_strategy); this enum names it."""

    LRU = EvictStrategy.KLru
    LFU = EvictStrategy.KLfu
    EPOCH_LRU = EvictStrategy.KEpochLru
    EPOCH_LFU = EvictStrategy.KEpochLfu
    CUSTOMIZED = EvictStrategy.KCustomized


class MemoryType(enum.Enum):
    """Where a buffer lives (DynamicEmb's ``dynamicemb.types.MemoryType``)."""

    DEVICE = "device"
    MANAGED = "managed"
    PINNED_HOST = "pinned_host"
    HOST = "host"


class DynamicEmbDataType(enum.Enum):
    """Element types named by DynamicEmb's dtype converters (``torch_to_dyn_emb`` ...)."""

    Float32 = "float32"
    BFloat16 = "bfloat16"
    Float16 = "float16"
    Int64 = "int64"
    UInt64 = "uint64"
    Int32 = "int32"
    UInt32 = "uint32"


class CopyMode(enum.Enum):
    """What a row copy moves: the embedding columns only, or the whole value (embedding
    and optimizer state), as DynamicEmb's ``CopyMode``."""

    EMBEDDING = 0
    VALUE = 1
