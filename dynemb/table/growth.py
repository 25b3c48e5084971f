"""How a ScoredHashTable runs a batch upsert: the op, then growth and a retry of the
keys that failed, while the table is below its capacity. Functions over the
table's TableState (table_state.py): ``storage``, ``layout``, ``lock``, ``strategy``,
``step``, ``size``, ``mutations``, ``generation``, ``max_buckets``, ``spill``,
``init``, ``clock``, ``change_log``, ``pins``, ``last_stats``, ``telemetry``.

Pins (csrc/core/table_ops.h, "Pins"; pin_ledger.py): every upsert runs as a batch in
flight, under the caller's ``PinHold`` (a training forward, held until its
backward) or one of its own released when the upsert ends, so it never evicts a
key of its own batch or of a batch in flight. A restore (``pins=False``) pins
nothing of its own: its keys compete by score, as a checkpoint's keys should.
"""

import contextlib
import sys
from collections.abc import Sequence

import torch

from dynemb import _ops
from dynemb._host_reads import DeferredRead, read_to_host
from dynemb.table.batch_stats import BatchStats
from dynemb.table.capacity import next_bucket_count
from dynemb.table.pin_ledger import PinHold
from dynemb.table.spill_persistence import commit_spill
from dynemb.table.table_state import TableState
from dynemb.table.table_storage import TableStorage, trim_host_heap


def hold_pins(state: TableState) -> PinHold:
    """A batch in flight: the keys its upserts find or store are not evicted until
    ``release()``."""
    return state.pins.hold(state.storage.pins)


def upsert(
    state: TableState, op, keys, scores, values, evicted, return_status=False, slots=None,
    per_key=None, hold=None, pins=True, defer=False, warm=False,
):  # fmt: skip
    """Runs a batch upsert, growing the table and retrying the keys that failed.

    ``op(tensors, policy, init, keys, scores, values, evicted[, per_key=])``: the batch
    op. ``per_key`` is an extra (n,) tensor passed to ``op`` (and subset on retries).
    ``slots``: an output found again if growth moved the keys. ``hold``: the PinHold
    of the batch (None: one for this upsert alone); ``pins=False``: the keys get no
    pin (a restore). Returns the op's status when ``return_status``, else BatchStats.
    ``defer``: where the table cannot grow (``can_defer``) its status counts are read
    later: the stats are then a ``DeferredLookup``, folded into ``size`` when read.
    ``warm``: the keys the op inserts read the table's warm-start source
    (``state.warm_start``; a training lookup's op only; such an upsert is not deferred),
    before the op: a source that fails leaves the table as it was.
    """
    log = state.change_log
    if log is not None and evicted is None:  # the op reports the residents it evicts
        evicted = state.evicted_buffers(keys.numel())
    with state.lock.write():
        new_rows = _read_warm(state, keys) if warm else None
        begun = begin_upsert(state, hold, pins)
        generation, batch_value, pin = begun
        try:
            extra = {} if per_key is None else {"per_key": per_key}
            status, counts = op(
                state.storage.tensors(), policy(state, batch_value, pin), state.init,
                keys, scores, values, evicted or [], **extra,
            )  # fmt: skip
            if defer and (not warm or state.warm_start is None) and can_defer(state):
                stats = DeferredLookup(DeferredRead(counts.view(1, -1), "status counts"), 0,
                                       keys, status, state.step)  # fmt: skip
                state.defer(stats)
                return status if return_status else stats
            status, stats = end_upsert(
                state, op, keys, scores, values, evicted, status, read_to_host(counts, "status counts").tolist(), begun,
                slots, per_key, log, new_rows,
            )  # fmt: skip
        finally:
            if hold is None and pin is not None:
                pin.release()
    return status if return_status else stats


def can_defer(state: TableState) -> bool:
    """Whether a batch upsert under way (after ``begin_upsert``) may read its status
    counts later: its table cannot grow, keeps no change log (which records the
    evicted keys now) and does not sample this step's evictions for telemetry."""
    return (
        state.num_buckets >= state.max_buckets
        and state.change_log is None
        and not state.telemetry.sampling
    )


def begin_upsert(state: TableState, hold=None, pins=True) -> tuple[int, int, PinHold | None]:
    """Counts a batch upsert (under ``lock.write()``); returns the storage generation
    it starts on, its batch value (the strategy's timestamp or step) and its pin
    hold (``hold``, else a new one the caller releases; None when ``pins`` is
    False)."""
    state.mutations += 1
    state.step += 1
    value = _ops.batch_value(state.strategy, state.step, state.clock)
    if hold is None and pins:
        hold = hold_pins(state)
    state.telemetry.before_upsert(value, hold is not None)
    return state.generation, value, hold


def end_upsert(
    state: TableState, op, keys, scores, values, evicted, status, counts, begun,
    slots=None, per_key=None, log=None, new_rows=None,
):  # fmt: skip
    """After the op of a batch upsert (under ``lock.write()``, ``counts`` a list):
    grows and retries the keys that failed while the table may grow, then counts
    what was stored and records it in ``log`` (the change log the batch started
    with; ``evicted`` then holds the op's evicted keys); ``new_rows``: the
    warm-start rows ``_read_warm`` read before the op, which the keys inserted take.
    Returns ``(status, BatchStats)``. ``begun``: what ``begin_upsert`` returned."""
    generation, batch_value, pin = begun
    while counts[_ops.Status.FAILED] and state.num_buckets < state.max_buckets:
        if not _grow(state, state.size + counts[_ops.Status.INSERTED]):
            break
        status, counts = _retry_failed(
            state, op, keys, scores, values, evicted, status, counts, batch_value, pin, per_key
        )
    state.size += counts[_ops.Status.INSERTED]
    if slots is not None and state.generation != generation:
        slots.copy_(_ops.table_find_slots(state.storage.tensors(), keys))  # moved by growth
    if new_rows is not None and new_rows.positions.numel():
        _warm_fill(state, keys, status, values, slots, new_rows)
    if log is not None:
        log.touched(keys[status != _ops.Status.FAILED])
        if counts[_ops.Status.EVICTED]:
            log.removed(evicted[0][status == _ops.Status.EVICTED])
    failed = counts[_ops.Status.FAILED]
    # A copy either way: the stats outlive the batch and must not pin its keys
    # (a checkpoint load passes views of mapped files).
    failed_keys = keys[status == _ops.Status.FAILED] if failed else keys.new_empty(0)
    stats = BatchStats(*counts, failed_keys=failed_keys)
    state.last_stats = stats
    state.telemetry.after_upsert(status, keys, counts, slots)
    return status, stats


def _read_warm(state: TableState, keys):
    """The warm-start rows of the keys the table does not hold (``TableFill.read_new``,
    under ``lock.write()`` before the op), or None without a warm-start source."""
    return None if state.warm_start is None else state.warm_start.read_new(state.storage, keys)


def _warm_fill(state: TableState, keys, status, values, slots, new_rows) -> None:
    """The keys the batch inserted (INSERTED, or EVICTED: in an evicted resident's
    slot) take the warm-start rows ``new_rows`` read before the op
    (dynemb.warm_start.table_fill); ``values``: the op's output rows when ``slots``
    is None (they get the source's rows too)."""
    new = torch.nonzero(
        (status == _ops.Status.INSERTED) | (status == _ops.Status.EVICTED), as_tuple=True
    )[0]
    if not new.numel():
        return
    new_keys = keys[new]
    if slots is not None:
        new_slots = slots[new]
    else:
        new_slots = _ops.table_find_slots(state.storage.tensors(), new_keys)
    pos, rows = new_rows.fill_slots(state.storage, new, new_slots)
    if slots is None and pos.numel():
        values[new[pos]] = rows[:, : state.dim]


def slot_upsert(table, policy, init, keys, scores, out, evicted, per_key=None):
    """The op of a training lookup for ``upsert`` (its ``values`` are the slots: ``out``
    takes the storage of the op's slots, no copy)."""
    found, status, counts = _ops.table_find_or_insert_slots(
        table, policy, init, keys, scores, per_key,
        evicted_keys=evicted[0] if evicted else None,
    )  # fmt: skip
    out.set_(found)
    return _ops.UpsertResult(status, counts)


def policy(state: TableState, batch_value: int, pin: PinHold | None) -> _ops.Policy:
    """The ops' policy of one batch upsert."""
    # Below capacity a full bucket grows the table instead of evicting.
    evict_below = _ops.EVICT_ANY if state.num_buckets == state.max_buckets else 0
    number = pin.number if pin is not None else 0
    return _ops.Policy(
        state.strategy, batch_value, state.seed, evict_below, state.dim, number,
        state.pins.floor(), state.score_half_life_steps or 0, state.step,
    )  # fmt: skip


def _retry_failed(
    state: TableState, op, keys, scores, values, evicted, status, counts, batch_value, pin,
    per_key=None,
):  # fmt: skip
    """Re-runs the failed positions of a batch on the grown table, in batch order."""
    pos = torch.nonzero(status == _ops.Status.FAILED, as_tuple=True)[0]
    sub_values = values[pos].contiguous()
    sub_evicted = [t[pos].contiguous() for t in evicted] if evicted else []
    sub_scores = scores[pos].contiguous() if scores is not None else None
    extra = {} if per_key is None else {"per_key": per_key[pos].contiguous()}
    sub_status, sub_counts = op(
        state.storage.tensors(), policy(state, batch_value, pin), state.init,
        keys[pos].contiguous(), sub_scores, sub_values, sub_evicted, **extra,
    )  # fmt: skip
    values[pos] = sub_values  # find_or_insert writes rows; assign leaves them as given
    for full, part in zip(evicted or [], sub_evicted):
        full[pos] = part
    status = status.clone()
    status[pos] = sub_status
    counts = [c for c in counts]
    counts[_ops.Status.FAILED] = 0
    return status, [
        a + b for a, b in zip(counts, read_to_host(sub_counts, "status counts").tolist())
    ]


# Rows of old storage a chunk of growth moves: at most 4 MiB of dim-16 float32 rows,
# small beside a large table, large enough that a chunk's call costs nothing; and at
# most 1/GROWTH_CHUNKS of the old table's. A chunk's new rows are faulted in before
# its old rows are freed, so the peak of a growth exceeds the tables' sum by a chunk:
# 1/16 of a small table (at 1M keys a chunk of 2^16 rows raised the peak by ~0.15x).
GROWTH_CHUNK_ROWS = 1 << 16
GROWTH_CHUNKS = 16


def _grows_in_chunks(storage: TableStorage) -> bool:
    """Whether growth moves this storage's rows in chunks, freeing them as it goes:
    plain host memory only (a device's memory, page-locked memory and a spill file's
    mapping keep the one-pass rehash, old and new storage side by side)."""
    return (
        sys.platform == "linux"  # MADV_DONTNEED zeroes anonymous pages there, not elsewhere
        and storage.layout.device.type == "cpu"
        and storage.spill is None
        and not storage.placement.registers_host_memory
        and storage.slow_values.numel() == 0
    )


def _grow(state: TableState, entries: int) -> bool:
    """Grows the bucket count of a table holding ``entries`` keys
    (``capacity.next_bucket_count``: a table that evicts doubles, a NO_EVICTION one
    grows to a load of 0.74, by 1.25x to 1.3x); returns False (table unchanged) if a
    rehash failed."""
    old = state.storage
    evicts = state.strategy != _ops.SCORE_STRATEGY_CODES["NO_EVICTION"]
    buckets = next_bucket_count(
        old.num_buckets, state.max_buckets, evicts, entries, old.layout.bucket_capacity
    )
    if not _rehash_into(state, old, buckets):
        return False
    if _grows_in_chunks(state.storage):
        # glibc keeps freed blocks below its mmap threshold (which rises to the size of
        # the largest block freed) in its heap: the old key metadata would stay in RSS
        # beside the new (at 1M keys up to 0.3x of the table after a growth).
        del old
        trim_host_heap()
    return True


def _rehash_into(state: TableState, old, buckets: int) -> bool:
    """Rehashes ``old`` into a new storage of ``buckets`` buckets and makes it the
    table's; returns False (table unchanged) if an entry did not fit."""
    window = _ops.spill_window(state.strategy, buckets)
    if _grows_in_chunks(old):
        new = TableStorage(state.layout, buckets, generation=old.generation + 1, lazy_values=True)
        moved = _rehash_in_chunks(old, new, window)
    else:
        new = TableStorage(state.layout, buckets, state.spill, old.generation + 1)
        moved = not _ops.table_rehash(old.tensors(), new.tensors(), window)
    if not moved:
        if state.spill is not None:
            state.spill.remove_generations_except(old.generation)
        return False
    state.storage = new
    state.lock.order.retire(old.tensors())  # rehash read them on this stream
    state.generation += 1
    if state.spill is not None:  # the committed state must not name a removed generation
        commit_spill(state)
    return True


def _rehash_in_chunks(old: TableStorage, new: TableStorage, window: int) -> bool:
    """Rehashes ``old`` into ``new`` (a ``lazy_values`` storage) a chunk of
    ``GROWTH_CHUNK_ROWS`` rows (at most 1/``GROWTH_CHUNKS`` of ``old``'s) at a time, in
    bucket order, freeing the rows of ``old`` each chunk moved and faulting in those of
    ``new`` just ahead of it: the process holds old and new key metadata but about one
    table of rows, not two.

    The range reduction is monotone (csrc/core/hash.h), so the entries homed in old
    buckets ``[b0, b1)`` land in new buckets ``[b0 * n' // n, ceil(b1 * n' / n) +
    reach)``, ``reach`` being 1 + SECOND_BUCKET_SPAN where a key may sit in its second
    bucket (``window`` 2), else 1; a chunk holds those and entries from their second
    buckets homed up to SECOND_BUCKET_SPAN buckets before it, which land lower still,
    except in the first chunk: entries homed in the last old buckets whose second
    bucket wrapped round to bucket 0 land in the last new buckets or, wrapping round
    again, in the first ones. So the rows of the first ``reach`` and of the last new
    buckets are faulted in (written with zeros) before the first chunk, and the others
    up to each chunk's reach before it: no chunk writes a row that a later fill would
    clear. The outcome is the same on every executor (each
    chunk is one ``table_rehash``, its batch rule deterministic).

    Returns False when an entry did not fit: ``old`` is then restored (the rows it
    freed copied back from ``new``; its keys and scores were never touched) and
    ``new`` is to be dropped.
    """
    n, n2, cap = old.num_buckets, new.num_buckets, old.layout.bucket_capacity
    step = max(1, min(GROWTH_CHUNK_ROWS, n * cap // GROWTH_CHUNKS) // cap)
    span = 1 + _ops.SECOND_BUCKET_SPAN if window > 1 else 1  # buckets from home a key reaches
    tail = max(0, n - span) * n2 // n * cap  # new rows the wrapped entries may reach
    filled = min(n2 * cap, min(n2, span) * cap, tail)  # rows [0, filled) faulted in
    new.fill_rows(0, filled)
    new.fill_rows(tail, n2 * cap)
    freed = 0  # old rows [0, freed) are moved, their whole pages freed
    try:
        for b0 in range(0, n, step):
            b1 = min(n, b0 + step)
            reach = min(n2 * cap, (-(-b1 * n2 // n) + span) * cap, tail)
            if reach > filled:
                new.fill_rows(filled, reach)
                filled = reach
            if _ops.table_rehash(old.bucket_range(b0, b1), new.tensors(), window):
                _restore_rows(old, new, freed)
                return False
            freed = b1 * cap
            old.release_rows(freed)
        new.fill_rows(filled, tail)
    except BaseException:  # an interrupt or an error between chunks: the old table stands
        _restore_rows(old, new, freed)
        raise
    return True


def _restore_rows(old: TableStorage, new: TableStorage, freed: int) -> None:
    """Copies back into ``old``'s freed rows ``[0, freed)`` the rows of their keys,
    which the chunks before a failed one moved to ``new``."""
    if not freed:
        return
    slots = old.occupied(0, freed)
    found = _ops.table_find_slots(new.tensors(), old.keys[slots])
    lost = int(read_to_host((found < 0).sum(), "growth restore check"))
    if lost:  # every entry of a chunk before the failed one is in new
        raise RuntimeError(f"growth lost {lost} moved entries")
    old.values[slots] = new.values[found]


class DeferredLookup:
    """The status counts of one table's lookup, read later (``_host_reads.DeferredRead``:
    with the next read of the device, e.g. the next batch's layout): a lookup that
    could not grow its table needs them only for bookkeeping (``size``,
    ``last_stats``, the failures the module counts)."""

    def __init__(
        self, read: DeferredRead, row: int, keys: torch.Tensor, status: torch.Tensor, step: int
    ):
        self._read, self._row, self._keys, self._status = read, row, keys, status
        self.step = step  # the table's step of the lookup (its telemetry counts it there)

    @property
    def ready(self) -> bool:
        """Whether the counts were read (``counts()`` then reads nothing)."""
        return self._read.ready

    def counts(self) -> list[int]:
        return self._read.value()[self._row].tolist()

    def inserted(self) -> int:
        return self.counts()[_ops.Status.INSERTED]

    def stats(self) -> BatchStats:
        counts = self.counts()
        failed = (
            self._keys[self._status == _ops.Status.FAILED] if counts[_ops.Status.FAILED] else None
        )
        return BatchStats(
            *counts, failed_keys=self._keys.new_empty(0) if failed is None else failed
        )


class DeferredErase:
    """The number of keys an erase removed, read later (as ``DeferredLookup``): it only
    keeps the table's ``size``."""

    def __init__(self, erased: torch.Tensor):
        self._read = DeferredRead(erased.sum(), "erased count")

    @property
    def ready(self) -> bool:
        return self._read.ready

    def inserted(self) -> int:
        return -self._read.value().item()

    def stats(self) -> None:  # an erase is no batch upsert: last_stats stays
        return None


def find_or_insert_slots_grouped(
    tables: Sequence,
    keys: Sequence[torch.Tensor],
    accesses: Sequence[torch.Tensor] | None = None,
    holds: Sequence[PinHold] | None = None,
    defer: bool = False,
    distinct_keys: bool = False,
) -> list:
    """``find_or_insert_slots(keys[t], accesses[t], holds[t])`` of each table of
    ``tables`` (ScoredHashTables whose ``groups_lookups`` holds, distinct, on one
    device), its op run for all of them in one call; a table whose keys did not all
    fit grows and retries them as alone (``accesses``: none, or the occurrences of
    each table's keys; ``holds``: none, or each table's PinHold of the batch).
    Write locks are taken in list order. Returns ``(slots, BatchStats)`` per table.

    ``distinct_keys``: each table's keys are pairwise distinct (the caller de-duplicated
    them; see ``_ops.table_find_or_insert_slots_grouped``).

    ``defer``: when no table can grow (each at its capacity, without a change log or
    a warm-start source), the status counts are not read now: each table's second
    item is a ``DeferredLookup``, folded into its ``size`` and ``last_stats`` when
    they are read.
    """
    states: list[TableState] = [table.state for table in tables]
    defer = defer and all(
        s.num_buckets >= s.max_buckets and s.change_log is None and s.warm_start is None
        for s in states
    )
    with contextlib.ExitStack() as stack:
        for state in states:
            stack.enter_context(state.lock.write())
        # Every warm-start source read before any table changes: one that fails changes none.
        new_rows = [_read_warm(state, k) for state, k in zip(states, keys)]
        # upsert's own steps around one op call for every table.
        begun = [begin_upsert(state, holds[t] if holds else None) for t, state in enumerate(states)]
        if not holds:  # the pins of this call alone
            for _, _, pin in begun:
                stack.callback(pin.release)
        slots, status, counts = _ops.table_find_or_insert_slots_grouped(
            [state.storage.tensors() for state in states],
            [policy(state, value, pin) for state, (_, value, pin) in zip(states, begun)],
            [list(state.init) for state in states], keys, accesses, distinct_keys,
        )  # fmt: skip
        # A sampled step of a table's telemetry records its evictions now.
        if defer and not any(state.telemetry.sampling for state in states):
            read = DeferredRead(counts, "status counts")
            results = []
            for t, state in enumerate(states):
                lookup = DeferredLookup(read, t, keys[t], status[t], state.step)
                state.defer(lookup)
                results.append((slots[t], lookup))
            return results
        counts = read_to_host(counts, "status counts").tolist()
        results = []
        for t, state in enumerate(states):
            _, stats = end_upsert(
                state, slot_upsert, keys[t], None, slots[t], None, status[t], counts[t],
                begun[t], slots[t], accesses[t] if accesses else None, new_rows=new_rows[t],
            )  # fmt: skip
            results.append((slots[t], stats))
    return results
