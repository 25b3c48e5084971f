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
"""

import threading

import torch


class ChangeLog:
    """Touched and removed keys of one table since the last ``take`` (see the module)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._touched: list[torch.Tensor] = []
        self._removed: list[torch.Tensor] = []
        self._takes = 0  # counts takes: a compaction across one is dropped

    def touched(self, keys: torch.Tensor) -> None:
        """Records ``keys`` (n,) int64 as stored with a possibly new row or score."""
        if keys.numel():
            with self._lock:
                self._touched.append(keys.detach().to("cpu", copy=True))

    def removed(self, keys: torch.Tensor) -> None:
        """Records ``keys`` (n,) int64 as no longer stored."""
        if keys.numel():
            with self._lock:
                self._removed.append(keys.detach().to("cpu", copy=True))

    def take(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(touched, removed)``: the distinct keys of each list, sorted, (m,) int64 on
        the host; the log starts empty again."""
        with self._lock:
            touched, removed = self._touched, self._removed
            self._touched, self._removed = [], []
            self._takes += 1
        return _distinct(touched), _distinct(removed)

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
            (name, len(parts), _distinct(parts))
            for name, parts in (("_touched", touched), ("_removed", removed))
            if len(parts) > 1
        ]
        with self._lock:
            if self._takes != takes:
                return
            for name, count, keys in merged:  # the lists only grew at their ends since
                getattr(self, name)[:count] = [keys]


def _distinct(parts: list[torch.Tensor]) -> torch.Tensor:
    if not parts:
        return torch.empty(0, dtype=torch.int64)
    return torch.unique(torch.cat(parts))


__all__ = ["ChangeLog"]
