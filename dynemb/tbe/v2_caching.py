"""DynamicEmb's caching, optimizer and benchmarking members of
``BatchedDynamicEmbeddingTablesV2``.

dynemb caches per table (a ``dynemb.tiering.CachedTable`` in ``tables``, whose
``has_cache`` is set); these members act on the cached tables and do nothing harmful
on the others.
"""

import math

import torch

from dynemb.config.optimizer import OptimizerConfig
from dynemb.config.types import DynamicEmbScoreStrategy
from dynemb.table.batches_in_flight import refuse_batches_in_flight
from dynemb.tiering.cache import Cache

_CUSTOMIZED = DynamicEmbScoreStrategy.CUSTOMIZED.value
_FILL_ROUNDS = 64  # insert rounds per table in fill_tables (evictions and growth take a few)


class CachingMembers:
    """Mixin of BatchedDynamicEmbeddingTablesV2 (uses ``tables``, ``dims``, ``device``,
    ``optimizer_config``)."""

    _enable_prefetch: bool = False
    _record_cache_metrics: bool = False

    @property
    def optimizer(self) -> OptimizerConfig:
        """The fused optimizer: its type and hyper-parameters (``optimizer_config``)."""
        return self.optimizer_config

    @property
    def cache(self) -> list[Cache | None] | None:
        """Per table its ``Cache`` (caching tables) or None; None when no table caches."""
        caches = [t if t.has_cache else None for t in self.tables]
        return caches if any(c is not None for c in caches) else None

    @property
    def enable_prefetch(self) -> bool:
        """Whether batches are prefetched before their forward (``prefetch_pipeline`` at
        construction). dynemb's forward is correct either way: a batch not prefetched
        is fetched by its forward."""
        return self._enable_prefetch

    @enable_prefetch.setter
    def enable_prefetch(self, value: bool) -> None:
        if not isinstance(value, bool):
            raise TypeError(f"enable_prefetch must be a bool, got {value!r}")
        self._enable_prefetch = value

    def set_record_cache_metrics(self, record: bool) -> None:
        """Records whether cache metrics are wanted; dynemb counts them always, in
        ``cache_stats()`` (one CacheStats per caching table)."""
        if not isinstance(record, bool):
            raise TypeError(f"set_record_cache_metrics: `record` must be a bool, got {record!r}")
        self._record_cache_metrics = record

    def reset_cache_states(self) -> None:
        """Empties every cache (its rows are written back to the slow tier first, so
        nothing is lost) and zeroes its CacheStats; no-op without caching.

        Raises:
            RuntimeError: a batch is in flight (a prefetch or forward before its
                backward): call it between batches.
        """
        cached = [(t, table) for t, table in enumerate(self.tables) if table.has_cache]
        busy = [self.table_names[t] for t, table in cached if table.batches_in_flight()]
        if busy:
            raise RuntimeError(
                f"reset_cache_states: tables {busy} have batches in flight (prefetched or "
                "forwarded, not yet backwarded); call it between batches"
            )
        for _, table in cached:
            table.empty_cache()
            table.reset_stats()

    def split_embedding_weights(self) -> list[torch.Tensor]:
        """One placeholder per table, ``(0, dim)``: the rows live in the hash tables
        (read them with ``export_keys_values``)."""
        return [torch.empty((0, dim), device=self.device) for dim in self.dims]

    def fill_tables(self, load_factor: float = 0.95, tolerance: float = 1e-5) -> None:
        """Inserts random keys (with initialised rows) into every table until it holds
        at least ``(load_factor - tolerance) * capacity`` keys: a benchmarking aid that
        measures lookups at a given occupancy. Caching tables fill their slow tier.

        Raises:
            ValueError: ``load_factor`` outside (0, 1] or ``tolerance`` outside [0, 1).
            RuntimeError: a table has batches in flight (dynemb.table.batches_in_flight).
        """
        if (
            isinstance(load_factor, bool)
            or not isinstance(load_factor, (int, float))
            or not 0 < load_factor <= 1
        ):
            raise ValueError(f"fill_tables: `load_factor` must be in (0, 1], got {load_factor!r}")
        if (
            isinstance(tolerance, bool)
            or not isinstance(tolerance, (int, float))
            or not 0 <= tolerance < 1
        ):
            raise ValueError(f"fill_tables: `tolerance` must be in [0, 1), got {tolerance!r}")
        refuse_batches_in_flight(list(zip(self.table_names, self.tables)), "fill_tables")
        generator = torch.Generator().manual_seed(0)
        for table in self.tables:
            _fill(table.persistent_table(), load_factor - tolerance, generator)


def _fill(table, fraction: float, generator: torch.Generator) -> None:
    for _ in range(_FILL_ROUNDS):
        missing = math.ceil(fraction * table.capacity()) - table.size()
        if missing <= 0:
            return
        keys = torch.randint(
            -(2**63), 2**63 - 1, (missing,), dtype=torch.int64, generator=generator
        )
        keys = keys.to(table.device)
        scores = None
        if table.strategy_code == _CUSTOMIZED:
            scores = torch.full_like(keys, table.custom_score or 0)
        table.find_or_insert(keys, scores)


__all__ = ["CachingMembers"]
