"""``TableState``: everything a ScoredHashTable's ops change or share, in one object.

The table owns one ``TableState`` and hands it to the helpers that implement its
ops: growth.py (batch upserts, growth, grouped lookups), spill_persistence.py (the
spill directory), slot_access.py (entries, write-backs, snapshots) and
entry_transfer.py (export and restore). They read and write its fields, never the
table's; so what each helper needs is the fields it names here, and another
module reaches a table's state only through ``ScoredHashTable.state``.

Concurrency: fields marked *locked* change only under ``lock.write()`` (readers of
``storage`` hold ``lock.read()``); the others are fixed at construction or are
objects with their own locks (``pins``, ``change_log``).
"""

import dataclasses
import threading
import time
from collections.abc import Callable
from typing import Any

import torch

from dynemb.table.batch_stats import BatchStats
from dynemb.table.change_log import ChangeLog
from dynemb.table.pin_ledger import PinLedger
from dynemb.table.rw_lock import RWLock
from dynemb.table.spill_files import SpillDirectory
from dynemb.table.table_storage import TableLayout, TableStorage
from dynemb.table.upsert_counts import TableTelemetry

_FOLDING = threading.Lock()  # folds of deferred lookups (rare, short): one for all tables


@dataclasses.dataclass(eq=False)
class TableState:
    """The state of one ScoredHashTable (see the module docstring).

    Attributes:
        dim: embedding columns of a row; ``seed``: the initializer's seed.
        layout: the geometry every storage of the table shares.
        strategy: the score strategy's code (``_ops`` / csrc/core/score_policy.h).
        score_half_life_steps: DECAYED_LFU's half-life in steps (None: no decay).
        max_buckets: the bucket count growth stops at.
        init: the ops' initializer list (``_ops.Init``'s fields).
        spill: the spill directory, or None (the table is in memory).
        storage: the buffers the ops address by slot; growth replaces it (locked).
        size: stored keys (locked; lookups deferred by ``defer`` are folded in when
            it is read).
        step: training lookups counted (the STEP score of the last batch; locked).
        mutations: bumped by every op that may move or drop a key (locked).
        generation: bumped when growth replaces ``storage`` (locked).
        custom_score: CUSTOMIZED: the score training lookups give (None: 0).
        change_log: the keys changed, for deltas (None: nothing recorded; locked).
        last_stats: the BatchStats of the latest batch upsert (a deferred lookup's
            when it is the latest).
        lock: readers of ``storage`` hold ``read()``, ops that move keys ``write()``;
            it orders the device's streams too (stream_order.py). Default: a new
            one for the layout's device.
        clock: the TIMESTAMP strategy's clock (tests replace it).
        pins: pin numbers of the batches in flight (growth.py, pin_ledger.py).
        token: the table's identity in its snapshots (only it rolls back to them).
        warm_start: the TableFill its training lookups' new keys read (None: none).
        telemetry: what its batch upserts did (upsert_counts.py; counted under the lock).
    """

    dim: int
    seed: int
    layout: TableLayout
    strategy: int
    max_buckets: int
    init: list[float]
    spill: SpillDirectory | None
    storage: TableStorage
    score_half_life_steps: int | None = None
    _size: int = 0
    step: int = 0
    mutations: int = 0
    generation: int = 0
    custom_score: int | None = None
    change_log: ChangeLog | None = None
    _last_stats: BatchStats | None = None
    _deferred: list = dataclasses.field(default_factory=list)
    lock: RWLock = None  # type: ignore[assignment] - the layout's device's, made below
    clock: Callable[[], int] = time.monotonic_ns
    pins: PinLedger = dataclasses.field(default_factory=PinLedger)
    token: object = dataclasses.field(default_factory=object)
    telemetry: TableTelemetry = dataclasses.field(init=False)
    warm_start: Any = None

    def __post_init__(self) -> None:
        if self.lock is None:
            self.lock = RWLock(self.layout.device)
        self.telemetry = TableTelemetry(self)

    def defer(self, lookup) -> None:
        """Records a lookup whose status counts are read later (under ``lock.write()``):
        ``lookup.inserted()`` and ``lookup.stats()`` give them (growth.py
        DeferredLookup, DeferredErase: stats None); ``size`` and ``last_stats`` fold them in when read. The lookups
        already read are folded first, so the list holds at most the recent ones."""
        self._fold(ready_only=True)
        self._deferred.append(lookup)

    def _fold(self, ready_only: bool = False) -> None:
        """Folds the deferred lookups into ``size`` and ``last_stats`` (``ready_only``:
        those already read, in order, without reading any)."""
        with _FOLDING:
            while self._deferred and (self._deferred[0].ready or not ready_only):
                lookup = self._deferred.pop(0)
                self._size += lookup.inserted()
                stats = lookup.stats()
                if stats is not None:
                    self._last_stats = stats
                    self.telemetry.count(lookup.counts(), lookup.step, self._size)

    def settle(self) -> None:
        """Folds every deferred lookup in now (reading their counts if not yet read):
        ``size``, ``last_stats`` and the telemetry are then up to date."""
        self._fold()

    @property
    def size(self) -> int:
        self._fold()
        return self._size

    @size.setter
    def size(self, value: int) -> None:
        self._fold()
        self._size = value

    @property
    def last_stats(self) -> BatchStats | None:
        self._fold()
        return self._last_stats

    @last_stats.setter
    def last_stats(self, stats: BatchStats | None) -> None:
        self._fold()
        self._last_stats = stats

    @property
    def num_buckets(self) -> int:
        return self.storage.num_buckets

    @property
    def device(self) -> torch.device:
        return self.layout.device

    def stored_keys(self) -> torch.Tensor:
        """(size,) int64: every stored key (the caller holds the lock)."""
        s = self.storage
        return s.keys.view(-1)[s.occupied(0, s.num_slots)]

    def evicted_buffers(self, n: int) -> list[torch.Tensor]:
        """The ops' ``evicted`` outputs for n keys: keys (n,), rows (n, row_width), scores (n,)."""
        return [
            torch.empty(n, dtype=torch.int64, device=self.device),
            torch.empty((n, self.layout.row_width), dtype=self.layout.value_dtype,
                        device=self.device),
            torch.empty(n, dtype=torch.int64, device=self.device),
        ]  # fmt: skip


__all__ = ["TableState"]
