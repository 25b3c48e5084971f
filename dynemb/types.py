"""Enums of the public API. Names and members mirror NVIDIA DynamicEmb."""

import enum


class DynamicEmbInitializerMode(enum.Enum):
    """How a new key's embedding row is initialised (see DynamicEmbInitializerArgs).

    Every mode is a function of (seed, key, column): the same key gets the same row
    whatever the batch order, thread count, device or world size.
    """

    NORMAL = 0
    TRUNCATED_NORMAL = 1
    UNIFORM = 2
    CONSTANT = 3
    DEBUG = 4  # every element is float(key): makes rows easy to check by eye


class DynamicEmbScoreStrategy(enum.Enum):
    """What a key's score is; in a full bucket the smallest score is evicted (ties:
    the smaller key digest, then the smaller key).

    TIMESTAMP: monotonic time (ns) of the batch that last accessed the key.
    STEP: the table's batch counter at the last access (one step per upsert batch).
    CUSTOMIZED: the caller's score; a new key scoring below every resident of its
        full bucket is refused (reported as failed) rather than evicting.
    LFU: number of accesses (each occurrence in a batch counts).
    NO_EVICTION: no score is kept; the table grows up to its max capacity, then
        inserts fail and are reported.
    The compound ``(TIMESTAMP, LFU)`` evicts by LFU count and keeps the last-access
    time beside it.
    """

    TIMESTAMP = 0
    STEP = 1
    CUSTOMIZED = 2
    LFU = 3
    NO_EVICTION = 4


class DynamicEmbCheckMode(enum.Enum):
    """What a lookup does with keys that could not be stored (safe-check)."""

    ERROR = 0
    WARNING = 1
    IGNORE = 2


class DynamicEmbPoolingMode(enum.Enum):
    """Pooling of BatchedDynamicEmbeddingTables; NONE returns one row per index."""

    SUM = 0
    MEAN = 1
    NONE = 2
