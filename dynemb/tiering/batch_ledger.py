"""``BatchLedger``: the numbers of a cached table's training batches still in flight.

A batch is *in flight* from its prefetch (or, without one, its forward) until its
backward; the cache pins the rows of batches in flight (cached_table.py, Pinning).
Numbers grow with each new batch. A forward takes the number of the oldest pending
prefetch, so the rows prefetched for a batch are pinned under the number its
forward and backward use.
"""

import collections
import threading

# Forward batches (without their backward yet) kept in flight; an older one is
# retired when a new forward starts (its backward then finds its keys again by key).
MAX_OPEN_FORWARDS = 2
# Prefetched batches not yet consumed by a forward; an older one is retired.
MAX_PENDING_PREFETCHES = 2


class BatchLedger:
    """Batch numbers in flight; safe to use from the prefetch thread and the training one."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._next = 1
        self._in_flight: set[int] = set()
        self._open_forwards: collections.deque[int] = collections.deque()
        self._pending_prefetches: collections.deque[int] = collections.deque()

    def begin_forward(self) -> tuple[int, bool]:
        """A training forward starts. Returns its number (the oldest pending
        prefetch's, or a new one) and whether an older forward was retired (its rows
        may move before its backward)."""
        with self._lock:
            b = self._pending_prefetches.popleft() if self._pending_prefetches else self._new()
            self._open_forwards.append(b)
            retired = False
            while len(self._open_forwards) > MAX_OPEN_FORWARDS:
                self._in_flight.discard(self._open_forwards.popleft())
                retired = True
        return b, retired

    def begin_prefetch(self) -> tuple[int, list[int]]:
        """A prefetch starts. Returns its number and the older prefetches retired."""
        with self._lock:
            b = self._new()
            self._pending_prefetches.append(b)
            retired = []
            while len(self._pending_prefetches) > MAX_PENDING_PREFETCHES:
                retired.append(self._pending_prefetches.popleft())
                self._in_flight.discard(retired[-1])
        return b, retired

    def end(self, batch: int) -> None:
        """The batch's backward is done: its rows may be evicted again."""
        with self._lock:
            self._in_flight.discard(batch)
            if batch in self._open_forwards:
                self._open_forwards.remove(batch)

    def upcoming(self) -> int | None:
        """The number the next forward takes from a prefetch, or None."""
        with self._lock:
            return self._pending_prefetches[0] if self._pending_prefetches else None

    def floor(self) -> int:
        """Victims must have a batch number below this: the oldest batch in flight."""
        with self._lock:
            return min(self._in_flight) if self._in_flight else self._next

    def _new(self) -> int:
        b = self._next
        self._next += 1
        self._in_flight.add(b)
        return b


__all__ = ["MAX_OPEN_FORWARDS", "MAX_PENDING_PREFETCHES", "BatchLedger"]
