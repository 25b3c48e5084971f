"""``ChangeLog``: the keys a table touched and removed since the log was last taken, for
versioned deltas (dynemb.deltas).

A table with a log attached (``ScoredHashTable.change_log``; none by default, so an
untracked table pays nothing) records, as they happen:

- touched: every key an upsert stored (a training lookup, insert_or_assign, restore,
  a cache write-back): its row or score may have changed;
- removed: every key that left the table: residents evicted by an upsert (reported by
  the op at the positions it marks EVICTED), erased keys, and every key of a clear or
  rollback.

The log over-approximates on purpose: a key evicted and stored again in the same
interval appears in both lists, and the reader decides by the table's state when it
takes the log (stored: an upsert; not stored: a tombstone). Keys only, kept as the
tensors the table recorded (one small tensor per batch), so memory is proportional to
the keys touched since the last ``take``; ``compact`` (a publisher's writer thread calls
it between deltas) merges them into their distinct keys, so that a ``take`` at a batch
boundary has less to sort.

Generations (a publisher's pre-capture, dynemb/deltas/precapture.py): ``request_seal``
asks the log to close its current lists as a sealed generation at the next record,
or announcement of a training lookup, made while no training write is pending
(``begin_writes`` / ``end_writes``: a training lookup is announced before it records
its keys and the residents it evicted, and its backward writes the rows later; no
seal falls in between). At that moment every row of every sealed key holds its final
value unless the key is recorded again: so a reader may copy a sealed generation's
rows while training goes on, and re-read only the keys recorded after the seal.
"""

import threading

import torch

from dynemb import _ops


class ChangeLog:
    """Touched and removed keys of one table since the last ``take`` (see the module)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._touched: list[torch.Tensor] = []
        self._removed: list[torch.Tensor] = []
        self._takes = 0  # counts takes and seals: a compaction across one is dropped
        # Sealed generations, oldest first: each its (touched, removed) recorded tensors.
        self._sealed: list[tuple[list[torch.Tensor], list[torch.Tensor]]] = []
        self._seal_requested = False
        self._writes_pending = 0  # training lookups whose backward has not written yet
        # A seal needs a training path that says when its writes end (begin_writes seen
        # since the last take): a table trained otherwise is never sealed.
        self._bracketed = False

    def touched(self, keys: torch.Tensor) -> None:
        """Records ``keys`` (n,) int64 as stored with a possibly new row or score."""
        if keys.numel():
            with self._lock:
                self._seal_if_requested()
                self._touched.append(keys.detach().to("cpu", copy=True))

    def removed(self, keys: torch.Tensor) -> None:
        """Records ``keys`` (n,) int64 as no longer stored."""
        if keys.numel():
            with self._lock:
                self._seal_if_requested()
                self._removed.append(keys.detach().to("cpu", copy=True))

    def take(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(touched, removed)``: the distinct keys of each list, sorted, (m,) int64 on
        the host, the sealed generations' keys included; the log starts empty again (no
        generation, no seal requested). Call it at a batch boundary."""
        touched, removed = self._take_lists()
        return _distinct(touched), _distinct(removed)

    def take_recorded(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``take`` without the de-duplication: each list's keys as recorded, repeats
        kept, in no order (a reader that de-duplicates anyway saves the sort)."""
        touched, removed = self._take_lists()
        return _joined(touched), _joined(removed)

    def _take_lists(self) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        with self._lock:
            touched, removed = self._touched, self._removed
            for sealed_touched, sealed_removed in self._sealed:
                touched += sealed_touched
                removed += sealed_removed
            self._touched, self._removed, self._sealed = [], [], []
            self._seal_requested = self._bracketed = False
            # A take is at a batch boundary, every row written: a lookup whose backward
            # never ran (a forward in training mode without one) holds no seal back.
            self._writes_pending = 0
            self._takes += 1
        return touched, removed

    def begin_writes(self) -> None:
        """A training lookup is about to record its keys; its backward will write their
        rows. A seal requested is made here, before them, when no write is pending: a
        seal after the lookup's first record (its keys) and before its last (the keys it
        evicted) would hold keys whose rows are not written yet."""
        with self._lock:
            self._bracketed = True
            self._seal_if_requested()
            self._writes_pending += 1

    def end_writes(self) -> None:
        """A training lookup's backward wrote its rows."""
        with self._lock:
            self._writes_pending = max(self._writes_pending - 1, 0)

    def request_seal(self) -> None:
        """Asks for the current lists to be sealed as a generation (see the module)."""
        with self._lock:
            self._seal_requested = True

    def take_sealed(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """``(touched, removed)`` (as ``take``) of the oldest sealed generation, which
        leaves the log, or None when none is sealed."""
        with self._lock:
            if not self._sealed:
                return None
            touched, removed = self._sealed.pop(0)
        return _distinct(touched), _distinct(removed)

    def _seal_if_requested(self) -> None:  # the lock is held
        if self._seal_requested and self._bracketed and self._writes_pending == 0:
            self._sealed.append((self._touched, self._removed))
            self._touched, self._removed = [], []
            self._seal_requested = False
            self._takes += 1  # a compaction running now would write into the new lists

    def touched_bound(self) -> int:
        """At most how many distinct keys the next ``take`` returns as touched: the
        recorded keys counted with their repeats (a compacted list counts once)."""
        with self._lock:
            lists = [self._touched, *(touched for touched, _ in self._sealed)]
            return sum(k.numel() for keys in lists for k in keys)

    @property
    def parts(self) -> int:
        """Tensors recorded since the last ``take`` or ``compact`` (both lists)."""
        with self._lock:
            return len(self._touched) + len(self._removed)

    def compact(self) -> None:
        """Replaces each list's recorded tensors by one of their distinct keys: the same
        keys, less memory, a cheaper ``take``. Recording and ``take`` may go on in other
        threads meanwhile (the keys recorded meanwhile stay; a ``take`` meanwhile gets
        the keys as they were and this compaction's work is dropped)."""
        with self._lock:
            touched, removed, takes = list(self._touched), list(self._removed), self._takes
        merged = [
            (name, len(parts), _compacted(parts))
            for name, parts in (("_touched", touched), ("_removed", removed))
            if len(parts) > 1
        ]
        with self._lock:
            if self._takes != takes:
                return
            for name, count, keys in merged:  # the lists only grew at their ends since
                getattr(self, name)[:count] = [keys]


def _joined(parts: list[torch.Tensor]) -> torch.Tensor:
    if len(parts) == 1:
        return parts[0]
    return torch.cat(parts) if parts else torch.empty(0, dtype=torch.int64)


def _compacted(parts: list[torch.Tensor]) -> torch.Tensor:
    """The distinct keys of ``parts`` (at least two), unsorted (a ``take`` sorts): the
    de-duplication op's hash set, 2-3x cheaper than a sort (550k + 15 x 40k keys:
    66 against 187 ms, 1 thread), on a writer thread beside training."""
    return _ops.unique_keys(torch.cat(parts))[0]


def _distinct(parts: list[torch.Tensor]) -> torch.Tensor:
    if not parts:
        return torch.empty(0, dtype=torch.int64)
    return torch.unique(torch.cat(parts))


__all__ = ["ChangeLog"]
