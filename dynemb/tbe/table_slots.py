"""How the TBE module gets the training slots of a batch's distinct keys: a training lookup
(inserting new keys, grouped over the tables that allow it), or, under admission, a
lookup of the keys admitted; keys that could not be stored are reported by the
table's safe-check mode.

``TableSlots`` is a part that a BatchedDynamicEmbeddingTables holds: it is given the
module's tables, their options, names and admission counters, is told each forward's
mode (``start_forward``), and keeps the counts of keys not stored.
"""

import warnings

import torch

from dynemb import _ops
from dynemb.config.types import DynamicEmbCheckMode, DynamicEmbScoreStrategy
from dynemb.table import lookup_undo
from dynemb.table.growth import DeferredLookup, find_or_insert_slots_grouped


class TableSlots:
    """Slots of distinct keys per table, for a module's training forwards.

    Args:
        tables: the module's tables (the Table protocol); ``table_options``: their
            options; ``table_names``: their names; ``admission_counters``: each
            table's admission counter or None.
    """

    def __init__(
        self, tables: list, table_options: list, table_names: list, admission_counters: list
    ) -> None:
        self.tables = tables
        self.table_options = table_options
        self.table_names = table_names
        self.admission_counters = admission_counters
        self._training = False  # the current forward's module mode (start_forward)
        self._forward_lookups = None  # the forward's recorded lookups (ERROR mode)
        self.safe_check_failures = [0] * len(tables)  # keys not stored, per table, cumulative
        # Per table, the last forward's training lookup counts (hits, inserted, evicted,
        # failed), summed over its lookup calls; None for a table that forward did not
        # look up in training, or whose counts are read later (a grouped lookup of
        # tables all in safe_check_mode IGNORE that cannot grow).
        self.lookup_outcomes: list[tuple[int, int, int, int] | None] = [None] * len(tables)

    def _inserts(self, t: int) -> bool:
        return self._training and self.table_options[t].training

    def table_slots(self, t: int, keys: torch.Tensor, accesses: torch.Tensor, hold=None):
        """Training slots of the distinct keys of table t (inserted, held by ``hold``,
        the table's ``begin_batch``), and the table's mutation count (backward finds
        the keys again if it changed). ``keys`` may be PaddedKeys (with their counts as
        the accesses) where ``takes_padded_keys(t)``."""
        table = self.tables[t]
        if self.admits(t):
            return self._admitted_slots(t, keys, accesses, hold), table.mutations
        slots = self._checked_lookup(t, keys, accesses, hold)
        return slots, table.mutations

    def grouped_slots(self, ts: list[int], distinct: list, holds: list) -> dict:
        """The training slots of tables ``ts`` that can share one op call (see
        ``_groups_lookup``), found in one, pinned under ``holds[t]``: ``{t: (slots,
        mutation count)}``. Keys that could not be stored are reported as
        ``_checked_lookup`` reports them."""
        ts = [t for t in ts if self._groups_lookup(t)]
        if not ts:
            return {}
        tables = [self.tables[t] for t in ts]
        # IGNORE only counts the keys not stored: that count may come later.
        ignore = all(
            self.table_options[t].safe_check_mode == DynamicEmbCheckMode.IGNORE for t in ts
        )
        results = find_or_insert_slots_grouped(
            tables, [distinct[t][0] for t in ts], [distinct[t][2] for t in ts],
            [holds[t] for t in ts], defer=ignore, distinct_keys=True,
        )  # fmt: skip
        found = {}
        self._count_deferred_failures(ready_only=True)
        for t, table, (slots, stats) in zip(ts, tables, results, strict=True):
            self._account(t, stats, stacklevel=4)
            found[t] = (slots, table.mutations)
        return found

    def _account(self, t: int, stats, stacklevel: int) -> None:
        """Counts (later, for a DeferredLookup) and reports the keys a grouped lookup
        of table t could not store."""
        if isinstance(stats, DeferredLookup):
            self._deferred_failures.append((t, stats))
            return
        self._record_outcome(t, stats)
        if stats.failed:
            self._report_failed(t, stats, undoable=False, stacklevel=stacklevel)

    def _record_outcome(self, t: int, stats) -> None:
        """Adds a training lookup's counts to table t's ``lookup_outcomes`` of this forward."""
        counts = (stats.hits, stats.inserted, stats.evicted, stats.failed)
        before = self.lookup_outcomes[t]
        if before is not None:
            counts = tuple(a + b for a, b in zip(before, counts, strict=True))
        self.lookup_outcomes[t] = counts

    @property
    def safe_check_failures(self) -> list[int]:
        """Keys not stored by training lookups, per table, cumulative."""
        self._count_deferred_failures()
        return self._safe_check_failures

    def _count_deferred_failures(self, ready_only: bool = False) -> None:
        """Adds the failures of deferred lookups (``ready_only``: of those already read,
        in order, reading none) to ``safe_check_failures``."""
        pending = self._deferred_failures
        while pending and (pending[0][1].ready or not ready_only):
            t, lookup = pending.pop(0)
            self._safe_check_failures[t] += lookup.counts()[_ops.Status.FAILED]

    @safe_check_failures.setter
    def safe_check_failures(self, counts: list[int]) -> None:
        self._safe_check_failures = counts
        self._deferred_failures: list = []  # (table, DeferredLookup) not counted yet

    def _groups_lookup(self, t: int) -> bool:
        """Whether table t's training lookup of this forward joins the grouped call: a
        table whose lookups may (``groups_lookups``) that inserts, without admission,
        whose lookups need no undo record (no table in ERROR mode)."""
        return (
            self._inserts(t)
            and not self.admits(t)
            and self._forward_lookups is None
            and self.tables[t].groups_lookups
        )

    def takes_padded_keys(self, t: int) -> bool:
        """Whether table t's training lookup of this forward takes padded distinct keys
        (``Table.takes_padded_keys``), without admission (which sizes them first)."""
        return self._inserts(t) and not self.admits(t) and self.tables[t].takes_padded_keys

    def admits(self, t: int) -> bool:
        """Whether table t's training lookups go through admission: it has a strategy
        (a counter alone admits every key)."""
        return self.table_options[t].admit_strategy is not None

    def _admitted_slots(self, t: int, keys: torch.Tensor, accesses: torch.Tensor, hold=None):
        """Training slots of table t under admission (-1 for keys not admitted, and for
        a cache's staged keys, which ``batch_rows`` serves).

        Only keys not stored yet (in either tier of a cache) are counted (each distinct key once, with its
        occurrences in the batch); admitted keys are inserted together with the stored
        ones (whose scores the upsert updates) and leave the counter.
        """
        table, counter = self.tables[t], self.admission_counters[t]
        strategy = self.table_options[t].admit_strategy
        upsert = table.contains(keys)  # a cache: stored in either tier
        new = torch.nonzero(~upsert, as_tuple=True)[0]
        if new.numel():
            new_keys = keys[new]
            if strategy.counts_keys:
                counts = counter.add_distinct(new_keys, accesses[new])
            else:  # no counter: the strategy sees this batch's occurrences
                counts = accesses[new]
            # The table's step before this batch: a replay or a restart sees the same.
            admit = strategy.admit_at(new_keys, counts, table.score_step)
            if (
                not isinstance(admit, torch.Tensor)
                or admit.dtype != torch.bool
                or admit.shape != new_keys.shape
            ):
                got = (
                    f"a {tuple(admit.shape)} {admit.dtype} tensor"
                    if isinstance(admit, torch.Tensor)
                    else repr(admit)
                )
                raise TypeError(
                    f"table {self.table_names[t]!r}: admit_strategy.admit must return a "
                    f"({new_keys.numel()},) torch.bool tensor, got {got}"
                )
            upsert.index_put_((new,), admit.to(keys.device))  # by position: no mask to size
        slots = torch.full_like(keys, -1)
        pos = torch.nonzero(upsert, as_tuple=True)[0]
        if pos.numel():
            slots[pos] = self._admitted_lookup(t, keys[pos], accesses[pos], hold)
            if pos.numel() != keys.numel() and hold is not None:
                table.widen_batch(hold, pos, keys.numel())
        if new.numel():
            held = slots >= 0
            staged = table.staged_rows(hold) if hold is not None else None
            if staged is not None:  # a cache's staged keys are stored too
                held |= staged[1] >= 0
            stored = new[held[new]]  # admitted and stored: no longer counted
            if counter is not None and stored.numel():
                counter.erase(keys[stored])
        return slots

    def _admitted_lookup(self, t: int, keys, accesses, hold):
        """The training lookup of table t's admitted keys: as a grouped call of its own
        where the table's lookups may join one (its status counts are then read later
        under IGNORE, when it cannot grow), else ``_checked_lookup``."""
        if not self.tables[t].groups_lookups or self._forward_lookups is not None:
            return self._checked_lookup(t, keys, accesses, hold)
        ignore = self.table_options[t].safe_check_mode == DynamicEmbCheckMode.IGNORE
        [(slots, stats)] = find_or_insert_slots_grouped(
            [self.tables[t]], [keys], [accesses], None if hold is None else [hold],
            defer=ignore, distinct_keys=True,
        )  # fmt: skip
        self._count_deferred_failures(ready_only=True)
        self._account(t, stats, stacklevel=6)
        return slots

    def start_forward(self, training: bool) -> None:
        """Called at the start of each forward, in the module's mode (``training``). With a table in ERROR mode, the
        training lookups of the forward are recorded, so that a failure undoes every
        table this forward changed (see dynemb.table.lookup_undo)."""
        self._training = training
        error = any(o.safe_check_mode == DynamicEmbCheckMode.ERROR for o in self.table_options)
        self._forward_lookups = [] if error else None
        self.lookup_outcomes = [None] * len(self.tables)

    def _checked_lookup(self, t: int, keys: torch.Tensor, accesses: torch.Tensor, hold=None):
        """``find_or_insert_slots`` of table t; keys that could not be stored are
        counted and reported by the safe-check mode. ERROR undoes the forward's
        lookups before it raises, so the batch stores nothing."""
        table = self.tables[t]
        log = self._forward_lookups
        before = table.record_lookup(keys) if log is not None else None
        undoable = before is not None
        slots, stats = table.find_or_insert_slots(keys, accesses, hold)
        if undoable:
            log.append((t, before, slots, stats))
        self._record_outcome(t, stats)
        if stats.failed:
            self._report_failed(t, stats, undoable, stacklevel=5)
        return slots

    def _report_failed(self, t: int, stats, undoable: bool, stacklevel: int) -> None:
        """Counts and reports the keys a lookup of table t could not store, by its
        safe-check mode (ERROR undoes the forward's recorded lookups, then raises)."""
        table = self.tables[t]
        mode = self.table_options[t].safe_check_mode
        self.safe_check_failures[t] += stats.failed
        what = (
            f"dynamic table {self.table_names[t]!r}: {stats.failed} keys could not be stored "
            f"({_why_failed(table)})"
        )
        if mode == DynamicEmbCheckMode.ERROR:
            stored = self._undo_forward() if undoable else "the keys that fit are stored"
            raise RuntimeError(f"{what}; safe_check_mode ERROR: {stored}")
        if mode == DynamicEmbCheckMode.WARNING:
            rows = "the eval initializer's rows" if not self.admits(t) else "non-admitted rows"
            warnings.warn(f"{what}; they got {rows}", stacklevel=stacklevel)

    def _undo_forward(self) -> str:
        """Undoes the recorded lookups of this forward, latest first; says what is kept."""
        log, self._forward_lookups = self._forward_lookups, []
        lost = {}
        for t, before, slots, stats in reversed(log):
            evicted = lookup_undo.undo(self.tables[t], before, slots, stats)
            if evicted:
                lost[self.table_names[t]] = lost.get(self.table_names[t], 0) + evicted
        tables = sorted({self.table_names[t] for t, *_ in log})
        stored = f"nothing of this batch is stored (lookups undone in tables {tables})"
        if lost:
            stored += (
                f", but residents it evicted to make room are lost (eviction cannot be "
                f"undone): {lost}"
            )
        return stored


def _why_failed(table) -> str:
    """Why a lookup's keys found no slot, and what avoids it (for safe-check messages)."""
    if getattr(table, "strategy_code", None) == DynamicEmbScoreStrategy.NO_EVICTION.value:
        return (
            f"NO_EVICTION: the table grows no further than max_capacity "
            f"{table.max_capacity()} and each key's buckets were full; raise max_capacity, "
            f"or let the table evict with another score_strategy"
        )
    return (
        f"each key's bucket held only keys of batches in flight (this batch's own, or "
        f"forwards awaiting their backward), which are never evicted; the table holds "
        f"{table.size()} of {table.capacity()} keys in buckets of {table.bucket_capacity}: "
        f"a larger bucket_capacity, smaller batches or a larger max_capacity avoid it"
    )
