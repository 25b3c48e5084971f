"""``CacheStats``: the cumulative counters of one cached table (cached_table.py)."""

import dataclasses
import threading

import torch

from dynemb._host_reads import DeferredRead

_FOLDING = threading.Lock()  # folds of counts added later (short): one for all tables


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

    A count the device holds is added with ``add_later``: it rides on the next read
    of the device (``_host_reads.DeferredRead``), so a training step does not wait for
    it; reading a counter adds what is pending for it first.
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

    def __post_init__(self) -> None:
        # (counter names, DeferredRead of their increments), oldest first; no field,
        # so that comparisons, repr and astuple see the counters only (read up to date)
        self._later: list = []

    def add(self, **counts: int) -> None:
        """Adds host counts (by counter name) without reading the pending ones (as
        ``stats.x += n`` would, reading ``x`` first)."""
        for name in counts:
            _check_name("add", name)
        with _FOLDING:
            for name, value in counts.items():
                object.__setattr__(self, name, object.__getattribute__(self, name) + value)

    def add_later(self, **counts: torch.Tensor) -> None:
        """Adds device counts (0-dim integer tensors, by counter name) when they are
        read: with the next read of their device, or when a counter is read."""
        for name in counts:
            _check_name("add_later", name)
        names = tuple(counts)
        values = torch.stack([counts[n].reshape(()).to(torch.int64) for n in names])
        with _FOLDING:
            self._later.append((names, DeferredRead(values, "cache stats")))

    def __getattribute__(self, name: str):
        if name in _COUNTERS and object.__getattribute__(self, "__dict__").get("_later"):
            _fold(self, name)
        return object.__getattribute__(self, name)

    def __copy__(self) -> "CacheStats":  # a copy of its own, every counter read
        return dataclasses.replace(self)

    def hit_rate(self) -> float:
        """Cache hit rate of training lookups (1.0 before any lookup)."""
        return self.lookup_hits / self.lookup_keys if self.lookup_keys else 1.0


_COUNTERS = tuple(f.name for f in dataclasses.fields(CacheStats))


def _check_name(method: str, name: str) -> None:
    if name not in _COUNTERS:
        raise ValueError(f"CacheStats.{method}: no counter {name!r}; one of {_COUNTERS}")


def _fold(stats: CacheStats, name: str) -> None:
    """Adds the pending counts already read, and those of counter ``name`` (reading
    them now if no read took them yet)."""
    with _FOLDING:
        later = object.__getattribute__(stats, "_later")
        kept = []
        for names, read in later:
            if not (read.ready or name in names):
                kept.append((names, read))
                continue
            for n, v in zip(names, read.value().tolist(), strict=True):
                object.__setattr__(stats, n, object.__getattribute__(stats, n) + v)
        later[:] = kept


__all__ = ["CacheStats"]
