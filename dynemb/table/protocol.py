"""``Table``: what the embedding kernel, the tiering, checkpoints and incremental dumps
need from a dynamic table, and nothing more.

Two classes implement it: ``ScoredHashTable`` (one table) and
``dynemb.tiering.CachedTable`` (a cache in front of a slow tier, whose ``buffers``
are the cache's). Callers depend on this protocol, never on a class's private
members (``make lint`` enforces it: ruff SLF001) nor on which class they hold:
what a cache does differently (a training forward's batch, its staged rows, eval
reads, prefetches, checkpoint content) is a member here, trivial in a table in
memory (ScoredHashTable's own).

Rows are addressed by slot: ``find_slots`` / ``find_or_insert_slots`` give the slots
of keys, and the ops of ``dynemb._ops`` read and write ``buffers.tensors()`` at those
slots. A slot is valid while ``mutations`` is unchanged; readers hold
``lock.read()``, anything that moves keys ``lock.write()``.

A training forward (dynemb.tbe) runs, per table: ``begin_batch`` (or
``skip_batch`` when the batch has no key of the table), ``find_or_insert_slots(...,
hold=batch)``, ``batch_rows`` (where the forward reads the rows), then in backward the
update of ``buffers`` and of ``staged_rows``, and ``end_batch``.
"""

from typing import Any, Protocol, runtime_checkable

import torch

from dynemb.table.lookup_undo import LookupRecord
from dynemb.table.rw_lock import RWLock
from dynemb.table.scored_hash_table import BatchStats, ScoredHashTable
from dynemb.table.table_storage import TableStorage
from dynemb.table.upsert_counts import TableTelemetry


@runtime_checkable
class Table(Protocol):
    """A dynamic table seen by slot (see the module docstring).

    Attributes:
        dim: embedding columns of a row.
        extra_columns: optimizer-state columns after them.
        seed: the initializer's seed (a new row is a function of (seed, key)).
    """

    dim: int
    extra_columns: int
    seed: int
    has_cache: bool
    """Whether ``prefetch``, ``cache_stats`` and ``empty_cache`` act (a cache)."""
    takes_padded_keys: bool
    """Whether ``find_or_insert_slots`` with a hold takes a forward's ``PaddedKeys``
    (dynemb.table.padded_keys): its lookup reads the device anyway, and their count
    rides along with that read."""

    @property
    def device(self) -> torch.device: ...

    @property
    def value_dtype(self) -> torch.dtype: ...

    @property
    def lock(self) -> RWLock:
        """Readers of ``buffers`` hold ``lock.read()``; ops that move keys ``lock.write()``."""
        ...

    @property
    def score_step(self) -> int:
        """The table's step: training lookups counted so far (kept by checkpoints)."""
        ...

    @property
    def strategy_code(self) -> int:
        """The score strategy's code (``DynamicEmbScoreStrategy`` value or a compound's)."""
        ...

    def rule_thresholds(self, rule: Any) -> Any:
        """An ``EvictionRule``'s ``RuleThresholds`` now, from the table's step and clock."""
        ...

    def erase_stale_buckets(
        self, thresholds: Any, begin: int, end: int
    ) -> tuple[torch.Tensor, int]:
        """Erases the stale keys of buckets ``[begin, end)`` but those of batches in
        flight; returns ``(erased keys, number of buckets)``."""
        ...

    @property
    def mutations(self) -> int:
        """Changes whenever stored keys may have moved: older slots must be found again."""
        ...

    @property
    def buffers(self) -> TableStorage:
        """The buffers the ops address by slot (the op argument ``table``)."""
        ...

    @property
    def init_values(self) -> list[float]:
        """The ops' initializer list for new rows (``_ops.Init``'s fields)."""
        ...

    def find_slots(self, keys: torch.Tensor) -> torch.Tensor:
        """(n,) int64 slots of keys, -1 where not stored; changes nothing."""
        ...

    def contains(self, keys: torch.Tensor) -> torch.Tensor:
        """(n,) bool: whether each key is stored (a cache: in either tier); changes
        nothing."""
        ...

    def find_or_insert_slots(
        self, keys: torch.Tensor, accesses: torch.Tensor | None = None, hold: Any = None
    ) -> tuple[torch.Tensor, BatchStats]:
        """Slots of distinct keys, inserting the missing ones (a training lookup);
        ``hold``: the ``begin_batch`` of the forward it belongs to, or None (one-off)."""
        ...

    def capacity(self) -> int: ...

    def max_capacity(self) -> int: ...

    def size(self) -> int: ...

    def erase(self, keys: torch.Tensor) -> int: ...

    def flush(self) -> None:
        """Makes a spilled table's directory hold the table as it is now."""
        ...

    # -------------------------------------------------- a training forward's batch

    def begin_batch(self) -> Any:
        """A training forward starts: returns its batch, in flight (its keys kept from
        eviction) until ``end_batch``, or until it is dropped unreleased."""
        ...

    def skip_batch(self) -> None:
        """A training forward without keys of this table (a cache counts it)."""
        ...

    def batch_rows(
        self, slots: torch.Tensor, batch: Any
    ) -> tuple[TableStorage | None, torch.Tensor]:
        """Where the forward of ``batch`` reads the rows of its distinct keys, ``slots``
        those of its lookup: ``(None, slots)``, ``buffers`` at those slots (under
        ``lock.read()``), or ``(storage, slots in it)``, a private copy."""
        ...

    def widen_batch(self, batch: Any, positions: torch.Tensor, count: int) -> None:
        """The training lookup under ``batch`` was of ``positions`` ((m,) int64) of the
        forward's ``count`` distinct keys (admission stores the others nowhere):
        ``batch_rows`` and ``staged_rows`` then address all ``count`` (-1: no row)."""
        ...

    def staged_rows(self, batch: Any) -> tuple[TableStorage, torch.Tensor] | None:
        """Rows of ``batch`` held outside ``buffers``, which its backward updates too:
        ``(storage, each distinct key's slot there or -1)``, or None."""
        ...

    def end_batch(self, batch: Any) -> None:
        """The batch's backward is done (or its forward failed): its keys may be evicted
        again, and rows it held elsewhere go home."""
        ...

    @property
    def groups_lookups(self) -> bool:
        """Whether training lookups may share one op call with other tables'
        (``dynemb.table.growth.find_or_insert_slots_grouped``)."""
        ...

    def record_lookup(self, keys: torch.Tensor) -> LookupRecord | None:
        """What a training lookup of distinct keys may change, for
        ``dynemb.table.lookup_undo.undo``; None when its lookups never fail."""
        ...

    # ----------------------------------------------------- eval reads, prefetches

    def eval_rows(self, keys: torch.Tensor) -> tuple[TableStorage | None, torch.Tensor]:
        """Where an eval lookup reads distinct keys' rows, as ``batch_rows`` (slot -1:
        not stored); inserts nothing, changes no score."""
        ...

    def prefetch(self, keys: torch.Tensor) -> int | None:
        """Brings a future training batch's distinct keys close (a cache: returns the
        batch number its forward takes); None: nothing to do."""
        ...

    def upcoming_batch(self) -> int | None:
        """The number of the next forward's prefetched batch, or None."""
        ...

    def batches_in_flight(self) -> int:
        """Training forwards before their backward (and a cache's pending prefetches);
        a load refuses while any is (dynemb.table.batches_in_flight)."""
        ...

    @property
    def cache_stats(self) -> Any:
        """A cache's dynemb.tiering.CacheStats, or None."""
        ...

    @property
    def telemetry(self) -> TableTelemetry:
        """Counts of the table's batch upserts, its evictions and bucket fill (a
        cache: those of its cache, whose evictions move rows to the slow tier)."""
        ...

    # ---------------------------------------------------------------- checkpoints

    def persistent_table(self) -> ScoredHashTable:
        """The table a checkpoint dumps and loads: the table itself, or a cache's slow
        tier after its rows were written back (the whole table)."""
        ...

    def empty_cache(self) -> None:
        """Writes a cache's rows back and empties it (before a load into the slow tier)."""
        ...


__all__ = ["Table"]
