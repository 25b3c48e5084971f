"""The slot-level side of ScoredHashTable: the ``dynemb.table.Table`` protocol that the
embedding kernel, the cache tier and incremental dumps use, and in-place snapshots.

``SlotAccess`` is a part of ScoredHashTable's API: its methods read and change the
table's TableState (``_state``, table_state.py) only, through the helpers of
growth.py.
"""

import dataclasses
from collections.abc import Callable

import torch

from dynemb import _ops
from dynemb._host_reads import read_to_host
from dynemb.config.types import DynamicEmbScoreStrategy
from dynemb.eviction_rules import RuleThresholds, stale_slots
from dynemb.table import batch_arguments as args
from dynemb.table.batch_stats import BatchStats
from dynemb.table.change_log import ChangeLog
from dynemb.table.growth import DeferredErase, slot_upsert, upsert
from dynemb.table.padded_keys import PaddedKeys
from dynemb.table.rw_lock import RWLock
from dynemb.table.table_state import TableState
from dynemb.table.table_storage import TableStorage
from dynemb.warm_start.table_fill import TableFill

# stored_entries de-duplicates n slots by a mark per slot when n * MARK_RATIO >= the
# table's slots, else by a sort: a small delta of a large table scans no table.
MARK_RATIO = 8


@dataclasses.dataclass(frozen=True)
class TableSnapshot:
    """A copy of a table's buffers and counters (``ScoredHashTable.snapshot``);
    ``owner`` is the token of the table it was taken from (only that table takes it
    back)."""

    generation: int
    buffers: list
    size: int
    step: int
    owner: object = None


class SlotAccess:
    """The Table protocol and snapshots (a part of ScoredHashTable, over ``_state``)."""

    _state: TableState

    @property
    def state(self) -> TableState:
        """The table's TableState, which the helpers of dynemb.table (growth, spill,
        transfer, slots) work on; other code uses the Table protocol."""
        return self._state

    @property
    def strategy_code(self) -> int:
        """The score strategy's code (``DynamicEmbScoreStrategy`` value, or
        ``TIMESTAMP_LFU`` for the compound)."""
        return self._state.strategy

    @property
    def custom_score(self) -> int | None:
        """CUSTOMIZED: the score training lookups give the keys they touch (set by
        ``dynemb.incremental_dump.set_score``; None: never set, keys get 0)."""
        return self._state.custom_score

    @custom_score.setter
    def custom_score(self, score: int) -> None:
        args.check_int("custom_score", score, 0)
        if score > args.INT64_MAX:
            raise ValueError(f"custom_score must be <= {args.INT64_MAX} (int64), got {score}")
        self._state.custom_score = score

    @property
    def change_log(self) -> ChangeLog | None:
        """The log recording the keys this table touches and removes (dynemb.deltas),
        or None (the default: nothing is recorded)."""
        return self._state.change_log

    @change_log.setter
    def change_log(self, log: ChangeLog | None) -> None:
        if log is not None and not isinstance(log, ChangeLog):
            raise TypeError(f"change_log must be a ChangeLog or None, got {log!r}")
        with self._state.lock.write():  # no batch half recorded
            self._state.change_log = log

    @property
    def warm_start(self):
        """The ``dynemb.warm_start.TableFill`` whose source the keys a training lookup
        inserts read their first rows from (None, the default: the initializer's)."""
        return self._state.warm_start

    @warm_start.setter
    def warm_start(self, fill) -> None:
        if fill is not None and not isinstance(fill, TableFill):
            raise TypeError(f"warm_start must be a TableFill or None, got {fill!r}")
        with self._state.lock.write():
            self._state.warm_start = fill

    @property
    def last_stats(self) -> BatchStats | None:
        """The BatchStats of the latest batch upsert (None before the first)."""
        return self._state.last_stats

    @last_stats.setter
    def last_stats(self, stats: BatchStats | None) -> None:
        self._state.last_stats = stats

    @property
    def lock(self) -> RWLock:
        """Readers of ``buffers`` hold ``lock.read()``; every op that moves a key holds
        ``lock.write()``."""
        return self._state.lock

    @property
    def mutations(self) -> int:
        """Bumped by every op that may move or drop a stored key: slots read under an
        older count must be found again."""
        return self._state.mutations

    @property
    def buffers(self) -> TableStorage:
        """The buffers rows are read and written in by slot (valid under ``lock``;
        growth replaces them)."""
        return self._state.storage

    @property
    def init_values(self) -> list[float]:
        """The initializer list of the ops (``_ops.Init``'s fields)."""
        return list(self._state.init)

    def find_slots(self, keys: torch.Tensor) -> torch.Tensor:
        """Slots of keys ((n,) int64, -1 where not stored); changes nothing."""
        with self._state.lock.read():
            return _ops.table_find_slots(self._state.storage.tensors(), keys)

    def find_or_insert_slots(
        self, keys: torch.Tensor, accesses: torch.Tensor | None = None, hold=None
    ) -> tuple[torch.Tensor, BatchStats]:
        """Slots of distinct keys ((n,) int64, -1 where not stored), inserting missing
        keys with initialised rows (or ``warm_start``'s): a training lookup (scores
        updated by the strategy).

        ``accesses`` (n,) int64: the occurrences each key stands for (LFU counts them).
        ``hold``: the batch's PinHold (``hold_pins()``), which keeps the keys from
        eviction until released; None: they are pinned during this call only.
        """
        slots = keys.new_empty(0)  # the op's output becomes its storage (set_ below)
        scores = None
        if self._state.strategy == DynamicEmbScoreStrategy.CUSTOMIZED.value:
            scores = torch.full_like(keys, self._state.custom_score or 0)

        stats = upsert(
            self._state, slot_upsert, keys, scores, slots, evicted=None, slots=slots,
            per_key=accesses, hold=hold, warm=True,
        )  # fmt: skip
        return slots, stats

    def claim_cache_slots(
        self, keys: torch.Tensor | PaddedKeys, batch: int, floor: int, evicted_keys: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
        """A cache tier's claim (dynemb.tiering.cached_table): hits first (their batch
        number rises to ``batch``), then a slot for every other key without touching
        rows, evicting only residents of batches below ``floor`` (-1: any; the cache
        pins by these batch numbers, not by pin numbers). The caller
        holds ``lock.write()``. Returns ``(slots, status, counts)``; the evicted keys
        are written to ``evicted_keys``. ``keys`` may be padded: the claim is then
        bounded by their count on the device, read with its status counts, and the
        results are those of the distinct keys (``keys.sized()``)."""
        live = None
        if isinstance(keys, PaddedKeys):
            keys, live, padded = keys.unique, keys.live, keys
        policy = _ops.Policy(_ops.CACHE_SCORES, batch, self.seed, floor, self.dim)
        slots, status, counts = _ops.table_find_or_insert_slots(
            self._state.storage.tensors(), policy, self._state.init, keys, None, None,
            init_rows=False, evicted_keys=evicted_keys, live=live,
        )  # fmt: skip
        counts = read_to_host(counts, "status counts").tolist()  # the padded count rides along
        if live is not None:
            u = padded.count()
            keys, slots, status = keys[:u], slots[:u], status[:u]
        self._state.size += counts[_ops.Status.INSERTED]
        self._state.telemetry.after_upsert(status, keys, counts)  # counted, never sampled
        return slots, status, counts

    def erase_held(self, keys: torch.Tensor) -> torch.Tensor:
        """``erase_keys`` by a caller that holds ``lock.write()`` (a cache tier dropping
        keys mid-operation); ``keys`` (n,) int64 on the table's device, checked by the
        caller. Returns (n,) bool: whether each was stored."""
        self._state.mutations += 1
        erased = _ops.table_erase(self._state.storage.tensors(), keys)
        if self._state.change_log is not None:
            self._state.size -= read_to_host(erased.sum(), "erased count").item()
            self._state.change_log.removed(keys[erased])
        else:  # the size is read when needed: no wait here
            self._state.defer(DeferredErase(erased))
        return erased

    def rule_thresholds(self, rule):
        """``RuleThresholds`` of an ``EvictionRule`` for this table now (its step and
        clock, read once on the host)."""
        st = self._state
        return RuleThresholds.of(rule, st.strategy, st.step, st.clock(), st.score_half_life_steps)

    def erase_stale_buckets(self, thresholds, begin: int, end: int) -> tuple[torch.Tensor, int]:
        """Erases the keys of buckets ``[begin, end)`` that ``thresholds`` (RuleThresholds) say
        are stale, except those pinned by a batch in flight (pin >= the floor); one
        ``lock.write()`` for the scan and the erase. Returns ``(erased keys, number of
        buckets now)`` (a range past the end is cut)."""
        st = self._state
        with st.lock.write():
            s, cap = st.storage, st.layout.bucket_capacity
            n = s.num_buckets
            begin, end = min(begin, n), min(end, n)
            slots = s.occupied(begin * cap, end * cap)
            if slots.numel() == 0:
                return s.keys[:0], n
            stale = stale_slots(s, slots, thresholds, self.dim)
            stale &= s.pins[slots] < st.pins.floor()  # never a key of a batch in flight
            keys = s.keys[slots[stale]]
            if keys.numel():
                self.erase_held(keys)
        return keys, n

    def find_entries(self, keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Whole rows (embedding + extra columns) and scores of keys: ``(rows (n,
        row_width), scores (n,), found (n,) bool)``, zeros where not stored."""
        with self._state.lock.read():
            s = self._state.storage
            # One probe per key, then whole-batch gathers by slot (absent keys read
            # slot 0, then get zeros): probing twice, for rows and for scores, cost
            # more than the gathers.
            slots = _ops.table_find_slots(s.tensors(), keys)
            found = slots >= 0
            at = slots.clamp(min=0)
            rows = s.rows(at, self._state.layout.row_width)
            scores = s.scores[at] if self._state.layout.keeps_scores else torch.zeros_like(keys)
        missing = ~found
        rows.index_fill_(0, torch.nonzero(missing, as_tuple=True)[0], 0)  # those rows only
        return rows, scores.masked_fill_(missing, 0), found

    def stored_entries(
        self, keys: torch.Tensor, out: Callable[[str, int, int, torch.dtype], torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """The entries of the keys stored, each once: ``(stored (m,) int64, rows (m,
        row_width), scores (m,) int64, missing (k,) int64)``, ``missing`` the keys not
        stored (repeats kept). ``keys`` may repeat: they are de-duplicated by slot (a
        mark per slot; a sort of the slots when they are few), the keys not sorted, and
        the m entries come in slot order, which makes the gathers walk memory forwards
        (one W-train table, 550k keys recorded 1.19M times, 1 thread: 208 ms against
        384 ms for a sort of the keys and a gather in key order). On a host table the rows
        and scores are written into ``out("rows", m, row_width, dtype)`` and
        ``out("scores", m, 0, torch.int64)`` (a publisher's reused buffers); on a GPU
        they stay on it."""
        with self._state.lock.read():
            s = self._state.storage
            slots = _ops.table_find_slots(s.tensors(), keys)
            found = slots >= 0
            # Every key stored (the common case): two masked selects saved (111 -> 99 ms).
            if read_to_host(found.all(), "all found").item():
                missing = keys[:0]
            else:
                missing, slots = keys[~found], slots[found]
            slots = _distinct_ascending(slots, s.num_slots)
            m, width = slots.numel(), self._state.layout.row_width
            host = self.device.type == "cpu"
            stored = torch.index_select(s.keys, 0, slots)
            rows = s.rows(slots, width, out=out("rows", m, width, s.values.dtype) if host else None)
            scores = out("scores", m, 0, torch.int64) if host else None
            if self._state.layout.keeps_scores:
                scores = torch.index_select(s.scores, 0, slots, out=scores)
            else:
                scores = torch.zeros_like(slots) if scores is None else scores.zero_()
        return stored, rows, scores, missing

    def write_back(
        self,
        keys: torch.Tensor,
        rows: torch.Tensor,
        scores: torch.Tensor,
        timestamps: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Stores distinct keys with whole rows and exactly these scores (CUSTOMIZED
        admits by them), not counting a step: a cache's write-back. ``timestamps``:
        (n,) int64 last-access times a compound (TIMESTAMP, ...) table stores with them
        (None: the write-back's clock, as a restore without them).

        Returns ``(keys, rows, scores)`` of every entry the table no longer holds:
        the residents evicted, then the given keys that could not be stored.
        """
        status, evicted = self._write_back(keys, rows, scores, timestamps, defer=False)
        stats = self._state.last_stats
        if not stats.evicted and not stats.failed:  # the common case: nothing to report
            return evicted[0][:0], evicted[1][:0], evicted[2][:0]
        out = status == _ops.Status.EVICTED
        lost = status == _ops.Status.FAILED
        if not read_to_host(lost.any(), "any failed").item():
            return evicted[0][out], evicted[1][out], evicted[2][out]
        return (
            torch.cat([evicted[0][out], keys[lost]]),
            torch.cat([evicted[1][out], rows[lost]]),
            torch.cat([evicted[2][out], scores[lost]]),
        )

    def write_back_counted(
        self,
        keys: torch.Tensor,
        rows: torch.Tensor,
        scores: torch.Tensor,
        timestamps: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``write_back`` that returns only how many entries the table no longer holds
        (residents evicted + keys not stored), a 0-dim int64 tensor on the table's
        device: nothing is read now where the table cannot grow (its status counts
        are read with the next read, as a deferred lookup's)."""
        status, _ = self._write_back(keys, rows, scores, timestamps, defer=True)
        return ((status == _ops.Status.EVICTED) | (status == _ops.Status.FAILED)).sum()

    def _write_back(self, keys, rows, scores, timestamps, defer: bool):
        """The upsert of ``write_back``: returns its status and the evicted buffers."""
        n, width = keys.numel(), self._state.layout.row_width
        rows = rows.contiguous()
        saved_scores = scores.contiguous() if self._state.layout.keeps_scores else None
        saved_times = None
        if timestamps is not None and self._state.layout.keeps_timestamps:
            saved_times = timestamps.contiguous()
        evicted = self._state.evicted_buffers(n)

        def op(table, policy, init, k, _scores, _values, ev, per_key):
            # One pass: whole rows (policy dim = row width) and their scores exactly as
            # given; per_key: the positions (re)tried.
            part = per_key.numel() != n
            r = rows[per_key] if part else rows
            sc = saved_scores[per_key] if part and saved_scores is not None else saved_scores
            ts = saved_times[per_key] if part and saved_times is not None else saved_times
            policy = policy._replace(dim=width)
            return _ops.table_restore(table, policy, init, k, r, None, sc, ts, ev)

        step = self._state.step  # a write-back is not a training step (STEP scores count those)
        positions = torch.arange(n, device=self.device)
        status = upsert(
            self._state, op, keys, None, positions, evicted, return_status=True,
            per_key=positions, defer=defer,
        )  # fmt: skip
        self._state.step = step
        return status, evicted

    def assign_scored(self, keys: torch.Tensor, values: torch.Tensor, scores: torch.Tensor):
        """``insert_or_assign`` of arguments the caller built valid (distinct (n,)
        int64 keys on the table's device, (n, dim) values of its dtype, (n,) int64
        scores >= 0), unchecked: nothing is read now where the table cannot grow
        (its status counts are read later). Returns the BatchStats or DeferredLookup."""
        return upsert(
            self._state, _ops.table_insert_or_assign, keys, scores, values, evicted=None,
            defer=True,
        )  # fmt: skip

    def snapshot(self) -> TableSnapshot:
        """A copy of every buffer and counter, for ``rollback`` (e.g. to rerun a batch
        op from one state, or undo a batch). Costs the table's memory once more."""
        st = self._state
        with st.lock.read():
            buffers = [b.clone() for b in st.storage.tensors()]
            return TableSnapshot(st.generation, buffers, st.size, st.step, st.token)

    def rollback(self, snapshot: TableSnapshot) -> None:
        """Restores the table in place to ``snapshot`` (its buffers are reused).

        Raises:
            TypeError: ``snapshot`` is not a TableSnapshot.
            ValueError: the snapshot was taken from another table, or the table grew since the snapshot (its buffers were replaced).
                Nothing changes then.
        """
        if not isinstance(snapshot, TableSnapshot):
            raise TypeError(
                f"rollback: `snapshot` must be a TableSnapshot of this table's snapshot(), "
                f"got {type(snapshot).__name__}"
            )
        if snapshot.owner is not self._state.token:
            raise ValueError(
                "rollback: `snapshot` was taken from another table; a table rolls back "
                "only to its own snapshot()"
            )
        st = self._state
        with st.lock.write():
            if snapshot.generation != st.generation:
                raise ValueError(
                    f"rollback: the table grew since the snapshot (storage generation "
                    f"{snapshot.generation} -> {st.generation}); take a new snapshot"
                )
            log = st.change_log
            if log is not None:  # any key may come back or go: all of them, both ways
                log.removed(st.stored_keys())
            for dst, src in zip(st.storage.tensors(), snapshot.buffers, strict=True):
                dst.copy_(src)
            if log is not None:
                log.touched(st.stored_keys())
            st.size, st.step = snapshot.size, snapshot.step
            st.mutations += 1


def _distinct_ascending(slots: torch.Tensor, num_slots: int) -> torch.Tensor:
    """The distinct values of ``slots`` (valid slots, repeats allowed), ascending: by a
    mark per slot when they are many (linear in the table's slots), else by a sort
    (linear-log in their number, no pass over the table). The same result either way."""
    if slots.numel() * MARK_RATIO < num_slots:
        return torch.unique(slots)
    marked = torch.zeros(num_slots, dtype=torch.bool, device=slots.device)
    marked[slots] = True
    return torch.nonzero(marked, as_tuple=True)[0]
