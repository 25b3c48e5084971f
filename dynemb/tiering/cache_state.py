"""``CacheState``: what a CachedTable and its ``CacheFill`` share, held by the table
and handed to the fill, so that each reads the other's data by name, never through
the other's private attributes."""

import dataclasses
import threading

import torch

from dynemb.config.storage import Storage
from dynemb.table.scored_hash_table import ScoredHashTable
from dynemb.tiering.batch_ledger import BatchLedger
from dynemb.tiering.cache_stats import CacheStats
from dynemb.tiering.staging import StagingArea


@dataclasses.dataclass(eq=False)
class CacheState:
    """The two tiers of a cached table and the bookkeeping between them.

    Attributes:
        cache: the fast table (its buffers, lock and initializer).
        storage: the slow tier holding every row.
        backing: the built-in slow table behind ``storage``, or None when it is external.
        name: the table's name, for messages about its storage.
        stats: the cache's counters.
        user_scores: (slots,) int64 scores of the cached keys under the table's strategy,
            or (slots, 2) of (score, last-access time) for the compounds.
        staging: rows of batches in flight held outside the cache.
        batches: the batches in flight and their numbers.
        storage_lock: one storage call at a time.
    """

    cache: ScoredHashTable
    storage: Storage
    backing: ScoredHashTable | None
    name: str
    stats: CacheStats
    user_scores: torch.Tensor
    staging: StagingArea
    batches: BatchLedger = dataclasses.field(default_factory=BatchLedger)
    storage_lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)


__all__ = ["CacheState"]
