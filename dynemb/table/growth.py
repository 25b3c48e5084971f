"""How a ScoredHashTable runs a batch upsert: the op, then growth and a retry of the
keys that failed, while the table is below its capacity.

``GrowingUpserts`` is a part of ScoredHashTable (it uses the table's ``_storage``,
``_layout``, ``_lock``, ``_strategy``, ``_step``, ``_size``, ``_mutations``,
``_generation``, ``_max_buckets``, ``_spill``, ``_init``, ``_clock``,
``_change_log``, ``_pins``); it is split out
so that the table's API, its growth and its spill persistence each have one file.

Pins (csrc/core/table_ops.h, "Pins"; pin_ledger.py): every upsert runs as a batch in
flight, under the caller's ``PinHold`` (a training forward, held until its
backward) or one of its own released when the upsert ends, so it never evicts a
key of its own batch or of a batch in flight. A restore (``pins=False``) pins
nothing of its own: its keys compete by score, as a checkpoint's keys should.
"""

import contextlib
from collections.abc import Sequence

import torch

from dynemb import _ops
from dynemb.table.batch_stats import BatchStats
from dynemb.table.pin_ledger import PinHold
from dynemb.table.slot_access import slot_upsert
from dynemb.table.table_storage import TableStorage
from dynemb.types import DynamicEmbScoreStrategy


class GrowingUpserts:
    """Batch upserts with growth (a mixin of ScoredHashTable)."""

    def hold_pins(self) -> PinHold:
        """A batch in flight for ``find_or_insert_slots(..., hold=)``: the keys its
        lookups find or store are not evicted until ``release()`` (a training
        forward releases it once its backward has written the rows)."""
        return self._pins.hold(self._storage.pins)

    def _upsert(
        self, op, keys, scores, values, evicted, return_status=False, slots=None, per_key=None,
        hold=None, pins=True,
    ):  # fmt: skip
        """Runs a batch upsert, growing the table and retrying the keys that failed.

        ``per_key`` is an extra (n,) tensor passed to ``op`` (and subset on retries).
        ``hold``: the PinHold of the batch (None: one for this upsert alone);
        ``pins=False``: the keys get no pin (a restore).
        """
        log = self._change_log
        if log is not None and evicted is None:  # the op reports the residents it evicts
            evicted = self._evicted_buffers(keys.numel())
        with self._lock.write():
            begun = self._begin_upsert(hold, pins)
            generation, batch_value, pin = begun
            try:
                extra = {} if per_key is None else {"per_key": per_key}
                status, counts = op(
                    self._storage.tensors(), self._policy(batch_value, pin), self._init,
                    keys, scores, values, evicted or [], **extra,
                )  # fmt: skip
                status, stats = self._end_upsert(
                    op, keys, scores, values, evicted, status, counts.tolist(), begun,
                    slots, per_key, log,
                )  # fmt: skip
            finally:
                if hold is None and pin is not None:
                    pin.release()
        return status if return_status else stats

    def _begin_upsert(self, hold=None, pins=True) -> tuple[int, int, PinHold | None]:
        """Counts a batch upsert (under ``lock.write()``); returns the storage generation
        it starts on, its batch value (the strategy's timestamp or step) and its pin
        hold (``hold``, else a new one the caller releases; None when ``pins`` is
        False)."""
        self._mutations += 1
        self._step += 1
        value = _ops.batch_value(self._strategy, self._step, self._clock)
        if hold is None and pins:
            hold = self.hold_pins()
        return self._generation, value, hold

    def _end_upsert(
        self, op, keys, scores, values, evicted, status, counts, begun,
        slots=None, per_key=None, log=None,
    ):  # fmt: skip
        """After the op of a batch upsert (under ``lock.write()``, ``counts`` a list):
        grows and retries the keys that failed while the table may grow, then counts
        what was stored and records it in ``log`` (the change log the batch started
        with; ``evicted`` then holds the op's evicted keys). Returns ``(status,
        BatchStats)``. ``begun``: what ``_begin_upsert`` returned."""
        generation, batch_value, pin = begun
        while counts[_ops.Status.FAILED] and self.num_buckets < self._max_buckets:
            if not self._grow():
                break
            status, counts = self._retry_failed(
                op, keys, scores, values, evicted, status, counts, batch_value, pin, per_key
            )
        self._size += counts[_ops.Status.INSERTED]
        if slots is not None and self._generation != generation:
            slots.copy_(_ops.table_find_slots(self._storage.tensors(), keys))  # moved by growth
        if log is not None:
            log.touched(keys[status != _ops.Status.FAILED])
            if counts[_ops.Status.EVICTED]:
                log.removed(evicted[0][status == _ops.Status.EVICTED])
        failed = counts[_ops.Status.FAILED]
        # A copy either way: the stats outlive the batch and must not pin its keys
        # (a checkpoint load passes views of mapped files).
        failed_keys = keys[status == _ops.Status.FAILED] if failed else keys.new_empty(0)
        stats = BatchStats(*counts, failed_keys=failed_keys)
        self.last_stats = stats
        return status, stats

    def _evicted_buffers(self, n: int) -> list[torch.Tensor]:
        """The ops' ``evicted`` outputs for n keys: keys (n,), rows (n, row_width), scores (n,)."""
        return [
            torch.empty(n, dtype=torch.int64, device=self.device),
            torch.empty((n, self._layout.row_width), dtype=self.value_dtype, device=self.device),
            torch.empty(n, dtype=torch.int64, device=self.device),
        ]

    def _retry_failed(
        self, op, keys, scores, values, evicted, status, counts, batch_value, pin, per_key=None
    ):
        """Re-runs the failed positions of a batch on the grown table, in batch order."""
        pos = torch.nonzero(status == _ops.Status.FAILED, as_tuple=True)[0]
        sub_values = values[pos].contiguous()
        sub_evicted = [t[pos].contiguous() for t in evicted] if evicted else []
        sub_scores = scores[pos].contiguous() if scores is not None else None
        extra = {} if per_key is None else {"per_key": per_key[pos].contiguous()}
        sub_status, sub_counts = op(
            self._storage.tensors(), self._policy(batch_value, pin), self._init,
            keys[pos].contiguous(), sub_scores, sub_values, sub_evicted, **extra,
        )  # fmt: skip
        values[pos] = sub_values  # find_or_insert writes rows; assign leaves them as given
        for full, part in zip(evicted or [], sub_evicted):
            full[pos] = part
        status = status.clone()
        status[pos] = sub_status
        counts = [c for c in counts]
        counts[_ops.Status.FAILED] = 0
        return status, [a + b for a, b in zip(counts, sub_counts.tolist())]

    def _policy(self, batch_value: int, pin: PinHold | None) -> _ops.Policy:
        # Below capacity a full bucket grows the table instead of evicting.
        evict_below = _ops.EVICT_ANY if self.num_buckets == self._max_buckets else 0
        number = pin.number if pin is not None else 0
        return _ops.Policy(
            self._strategy, batch_value, self.seed, evict_below, self.dim, number,
            self._pins.floor(), self.score_half_life_steps or 0, self._step,
        )  # fmt: skip

    def _grow(self) -> bool:
        """Doubles the bucket count; returns False (table unchanged) if a rehash failed."""
        old = self._storage
        buckets = min(2 * old.num_buckets, self._max_buckets)
        new = TableStorage(self._layout, buckets, self._spill, old.generation + 1)
        window = _ops.spill_window(self._strategy, buckets)
        if _ops.table_rehash(old.tensors(), new.tensors(), window):
            if self._spill is not None:
                self._spill.remove_generations_except(old.generation)
            return False
        self._storage = new
        self._generation += 1
        if self._spill is not None:  # the committed state must not name a removed generation
            self._commit_spill()
        return True


def joins_grouped_lookups(table) -> bool:
    """Whether ``table``'s training lookups may run in ``find_or_insert_slots_grouped``:
    a ScoredHashTable (a GrowingUpserts) without a change log (its lookups report the
    residents they evict) and not CUSTOMIZED (its lookups carry scores)."""
    return (
        isinstance(table, GrowingUpserts)
        and table.change_log is None
        and table.strategy_code != DynamicEmbScoreStrategy.CUSTOMIZED.value
    )


def find_or_insert_slots_grouped(
    tables: Sequence[GrowingUpserts],
    keys: Sequence[torch.Tensor],
    accesses: Sequence[torch.Tensor] | None = None,
    holds: Sequence[PinHold] | None = None,
) -> list:
    """``find_or_insert_slots(keys[t], accesses[t], holds[t])`` of each table of
    ``tables`` (each ``joins_grouped_lookups``, distinct, on one device), its op run
    for all of them in one call; a table whose keys did not all fit grows and retries
    them as alone (``accesses``: none, or the occurrences of each table's keys;
    ``holds``: none, or each table's PinHold of the batch).
    Write locks are taken in list order. Returns ``(slots, BatchStats)`` per table."""
    with contextlib.ExitStack() as stack:
        for table in tables:
            stack.enter_context(table.lock.write())
        # GrowingUpserts' own steps around one op call for every table (this function
        # belongs to the mixin; it stands outside the class to take a list of tables).
        begun = [
            table._begin_upsert(holds[t] if holds else None)  # noqa: SLF001
            for t, table in enumerate(tables)
        ]
        if not holds:  # the pins of this call alone
            for _, _, pin in begun:
                stack.callback(pin.release)
        slots, status, counts = _ops.table_find_or_insert_slots_grouped(
            [table.buffers.tensors() for table in tables],
            [table._policy(value, pin) for table, (_, value, pin) in zip(tables, begun)],  # noqa: SLF001
            [table.init_values for table in tables], keys, accesses,
        )  # fmt: skip
        counts = counts.tolist()
        results = []
        for t, table in enumerate(tables):
            _, stats = table._end_upsert(  # noqa: SLF001
                slot_upsert, keys[t], None, slots[t], None, status[t], counts[t], begun[t],
                slots[t], accesses[t] if accesses else None,
            )  # fmt: skip
            results.append((slots[t], stats))
    return results
