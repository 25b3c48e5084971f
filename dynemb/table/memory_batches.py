"""What a table in memory does where a cached table does more (dynemb.tiering): the
``dynemb.table.Table`` members of a training forward's batch, of eval reads, of
prefetches and of checkpoints, each the trivial version of a cache's.

``MemoryBatches`` is a part of ScoredHashTable's API: it reads the table's TableState
(``_state``, table_state.py) only.
"""

import torch

from dynemb.config.types import DynamicEmbScoreStrategy
from dynemb.table import lookup_undo
from dynemb.table.growth import hold_pins
from dynemb.table.lookup_undo import LookupRecord
from dynemb.table.pin_ledger import PinHold
from dynemb.table.table_state import TableState
from dynemb.table.table_storage import TableStorage
from dynemb.table.upsert_counts import TableTelemetry


class MemoryBatches:
    """The TBE module's and the checkpoints' Table members of a table in memory (a part of
    ScoredHashTable, over ``_state``)."""

    _state: TableState

    has_cache = False  # prefetch, cache_stats and empty_cache do nothing
    takes_padded_keys = False  # its lookups defer their reads: it needs the keys sized

    def hold_pins(self) -> PinHold:
        """A batch in flight for ``find_or_insert_slots(..., hold=)``: the keys its
        lookups find or store are not evicted until ``release()`` (a training
        forward releases it once its backward has written the rows)."""
        return self._hold_locked()

    # ------------------------------------------------ a training forward's batch

    def begin_batch(self) -> PinHold:
        """A training forward starts: its keys are pinned until ``end_batch`` (or until
        the hold is dropped), and the change log, if any, is told that its backward
        will write their rows (a delta's seal waits for them)."""
        log = self._state.change_log
        if log is not None:
            log.begin_writes()
        return self._hold_locked()

    def _hold_locked(self) -> PinHold:
        # Under the write guard: a hold may renumber the pins buffer in place, which no
        # op of another thread (nor, on a GPU, of another stream) may see half done.
        with self._state.lock.write():
            return hold_pins(self._state)

    def skip_batch(self) -> None:
        """A training forward without keys of this table: nothing to do."""

    def batch_rows(
        self, slots: torch.Tensor, batch: PinHold
    ) -> tuple[TableStorage | None, torch.Tensor]:
        """Where a training forward reads its distinct keys' rows: ``(None, slots)``,
        the table's ``buffers`` (under ``lock.read()``) at their slots."""
        return None, slots

    def widen_batch(self, batch: PinHold, positions: torch.Tensor, count: int) -> None:
        """A lookup of some of a forward's keys: nothing to re-address (no staged rows)."""

    def staged_rows(self, batch: PinHold) -> tuple[TableStorage, torch.Tensor] | None:
        """Rows of the batch held outside ``buffers``: none in a table in memory."""
        return None

    def end_batch(self, batch: PinHold) -> None:
        """The batch's backward wrote its rows (or its forward failed): its keys may be
        evicted again and the change log's pending writes are done."""
        batch.release()
        log = self._state.change_log
        if log is not None:
            log.end_writes()

    def batches_in_flight(self) -> int:
        """Training forwards before their backward (and one-off upserts running)."""
        return self._state.pins.in_flight()

    # ---------------------------------------------------- eval reads, prefetches

    def eval_rows(self, keys: torch.Tensor) -> tuple[TableStorage | None, torch.Tensor]:
        """Where an eval lookup reads distinct keys' rows: ``(None, slots)``, the
        table's ``buffers`` at their slots (-1: not stored); inserts nothing."""
        return None, self.find_slots(keys)

    def prefetch(self, keys: torch.Tensor) -> None:
        """No cache to fill: nothing to do (returns no batch number)."""
        return None

    def upcoming_batch(self) -> None:
        """No prefetched batch waits (a cache's next forward's number, else None)."""
        return None

    @property
    def cache_stats(self) -> None:
        """A cache's CacheStats; None for a table without one."""
        return None

    @property
    def telemetry(self) -> TableTelemetry:
        """What this table's batch upserts did (dynemb.table.telemetry); the lookups
        whose status counts were deferred are counted first (one read of the device)."""
        self._state.settle()
        return self._state.telemetry

    # ------------------------------------------------- lookups of one forward

    @property
    def groups_lookups(self) -> bool:
        """Whether training lookups may run in ``growth.find_or_insert_slots_grouped``:
        no change log (its lookups report the residents they evict) and not CUSTOMIZED
        (its lookups carry scores)."""
        return (
            self._state.change_log is None
            and self._state.strategy != DynamicEmbScoreStrategy.CUSTOMIZED.value
        )

    def record_lookup(self, keys: torch.Tensor) -> LookupRecord:
        """What a training lookup of distinct ``keys`` may change, for
        ``dynemb.table.lookup_undo.undo``."""
        return lookup_undo.record(self, keys)

    # --------------------------------------------------------------- checkpoints

    def persistent_table(self):
        """The table a checkpoint dumps and loads: this one."""
        return self

    def empty_cache(self) -> None:
        """No cache to empty before a load: nothing to do."""
