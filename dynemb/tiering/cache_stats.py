"""``CacheStats``: the cumulative counters of one cached table (cached_table.py)."""

import dataclasses


@dataclasses.dataclass
class CacheStats:
    """Cumulative counters of one cached table (distinct keys per batch).

    Attributes:
        lookup_keys / lookup_hits: keys of training lookups, and those found in
            the cache (the forward's hit rate is their ratio).
        prefetch_keys / prefetch_hits: the same for prefetches.
        fetched: keys read from the storage into the cache.
        written_back: rows written back to the storage (cache evictions and syncs).
        storage_drops: rows the storage dropped (slow-tier evictions): lost.
        not_cached: keys that could not enter the cache (bucket fully pinned);
            a training lookup stages them (served and updated outside the cache).
        staged: keys of training lookups served that way (staged by the lookup,
            or already staged by a batch in flight).
    """

    lookup_keys: int = 0
    lookup_hits: int = 0
    prefetch_keys: int = 0
    prefetch_hits: int = 0
    fetched: int = 0
    written_back: int = 0
    storage_drops: int = 0
    not_cached: int = 0
    staged: int = 0

    def hit_rate(self) -> float:
        """Cache hit rate of training lookups (1.0 before any lookup)."""
        return self.lookup_hits / self.lookup_keys if self.lookup_keys else 1.0


__all__ = ["CacheStats"]
