"""``TableState``: everything a ScoredHashTable's ops change or share, in one object.

The table owns one ``TableState`` and hands it to the helpers that implement its
ops: growth.py (batch upserts, growth, grouped lookups), spill_persistence.py (the
spill directory), slot_access.py (slots, entries, write-backs, snapshots) and
entry_transfer.py (export and restore). They read and write its fields, never the
table's; so what each helper needs is the fields it names here, and another
module reaches a table's state only through ``ScoredHashTable.state``.

Concurrency: fields marked *locked* change only under ``lock.write()`` (readers of
``storage`` hold ``lock.read()``); the others are fixed at construction or are
objects with their own locks (``pins``, ``change_log``).
"""

import dataclasses
import time
from collections.abc import Callable

import torch

from dynemb.table.batch_stats import BatchStats
from dynemb.table.change_log import ChangeLog
from dynemb.table.pin_ledger import PinLedger
from dynemb.table.rw_lock import RWLock
from dynemb.table.spill_files import SpillDirectory
from dynemb.table.table_storage import TableLayout, TableStorage
from dynemb.table.telemetry import TableTelemetry


@dataclasses.dataclass(eq=False)
class TableState:
    """The state of one ScoredHashTable (see the module docstring).

    Attributes:
        dim: embedding columns of a row; ``seed``: the initializer's seed.
        layout: the geometry every storage of the table shares.
        strategy: the score strategy's code (``_ops`` / csrc/core/score_policy.h).
        score_half_life_steps: DECAYED_LFU's half-life in steps (None: no decay).
        max_buckets: the bucket count growth stops at.
        init: the ops' initializer list ``[mode, a, b, lower, upper, extra_init]``.
        spill: the spill directory, or None (the table is in memory).
        storage: the buffers the ops address by slot; growth replaces it (locked).
        size: stored keys (locked).
        step: training lookups counted (the STEP score of the last batch; locked).
        mutations: bumped by every op that may move or drop a key (locked).
        generation: bumped when growth replaces ``storage`` (locked).
        custom_score: CUSTOMIZED: the score training lookups give (None: 0).
        change_log: the keys changed, for deltas (None: nothing recorded; locked).
        last_stats: the BatchStats of the latest batch upsert.
        lock: readers of ``storage`` hold ``read()``, ops that move keys ``write()``.
        clock: the TIMESTAMP strategy's clock (tests replace it).
        pins: pin numbers of the batches in flight (growth.py, pin_ledger.py).
        token: the table's identity in its snapshots (only it rolls back to them).
        telemetry: what its batch upserts did (telemetry.py; counted under the lock).
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
    size: int = 0
    step: int = 0
    mutations: int = 0
    generation: int = 0
    custom_score: int | None = None
    change_log: ChangeLog | None = None
    last_stats: BatchStats | None = None
    lock: RWLock = dataclasses.field(default_factory=RWLock)
    clock: Callable[[], int] = time.monotonic_ns
    pins: PinLedger = dataclasses.field(default_factory=PinLedger)
    token: object = dataclasses.field(default_factory=object)
    telemetry: TableTelemetry = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        self.telemetry = TableTelemetry(self)

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
