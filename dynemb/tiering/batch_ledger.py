"""``BatchLedger``: the numbers of a cached table's training batches still in flight.

A batch is *in flight* from its prefetch (or, without one, its forward) until its
backward; the cache pins the rows of batches in flight (cached_table.py, Pinning).
Numbers grow with each new batch. A forward takes the number of the oldest pending
prefetch, so the rows prefetched for a batch are pinned under the number its
forward and backward use.

Every training forward holds its number in a ``BatchHold`` until its backward
releases it, however many forwards run before one backward (a multi-tower model
looks one table up several times per step). A hold whose forward never gets a
backward (a graph dropped unused, a forward under ``torch.no_grad``) is released
when it is garbage-collected: ``__del__`` only queues it (it may run in any thread,
at any allocation, even inside this ledger's lock), and the ledger ends it at its
next call; its table's own leftovers (``payload``) wait in ``dropped()``.
"""

import collections
import threading
from typing import Any

# Prefetched batches not yet consumed by a forward; an older one is retired (its
# keys stay cached, unpinned; its forward, if it ever comes, looks them up again).
# A pipeline prefetches the batches of step t+1 while those of step t wait for
# their forwards: 8 keeps every prefetch of four forwards per step.
MAX_PENDING_PREFETCHES = 8


class BatchHold:
    """The number of one training forward in flight; ``release()`` ends it.

    Attributes:
        number: the batch number (the cache pins its rows under it).
        payload: what the table must undo if the hold is dropped unreleased (a
            cached table's staged keys, or None); returned by ``BatchLedger.dropped``.
    """

    __slots__ = ("number", "payload", "_ledger")

    def __init__(self, ledger: "BatchLedger", number: int) -> None:
        self.number = number
        self.payload: Any = None
        self._ledger = ledger

    def release(self) -> None:
        """Ends the batch: its rows may be evicted again (idempotent)."""
        ledger, self._ledger = self._ledger, None
        if ledger is not None:
            ledger.end(self.number)

    def __del__(self) -> None:
        ledger, self._ledger = self._ledger, None
        if ledger is not None:
            ledger.drop(self.number, self.payload)


class BatchLedger:
    """Batch numbers in flight; safe to use from the prefetch thread and the training one."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._next = 1
        self._in_flight: set[int] = set()
        self._pending_prefetches: collections.deque[int] = collections.deque()
        # (number, payload) of holds dropped unreleased: appended without a lock (an
        # atomic deque append), moved out under the lock by _collect.
        self._dropped: collections.deque[tuple[int, Any]] = collections.deque()
        self._dropped_payloads: list = []

    def begin_forward(self) -> BatchHold:
        """A training forward starts. Returns its hold, numbered as the oldest pending
        prefetch, or with a new number; it stays in flight until released."""
        with self._lock:
            self._collect()
            b = self._pending_prefetches.popleft() if self._pending_prefetches else self._new()
        return BatchHold(self, b)

    def begin_prefetch(self) -> tuple[int, list[int]]:
        """A prefetch starts. Returns its number and the older prefetches retired."""
        with self._lock:
            self._collect()
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
            self._collect()
            self._in_flight.discard(batch)

    def drop(self, batch: int, payload: Any) -> None:
        """A hold was dropped unreleased: the batch ends at the ledger's next call,
        and ``payload`` (unless None) is handed to ``dropped()``. Takes no lock."""
        self._dropped.append((batch, payload))

    def dropped(self) -> list:
        """Payloads of the holds dropped unreleased since the last call."""
        with self._lock:
            self._collect()
            out, self._dropped_payloads = self._dropped_payloads, []
        return out

    def upcoming(self) -> int | None:
        """The number the next forward takes from a prefetch, or None."""
        with self._lock:
            return self._pending_prefetches[0] if self._pending_prefetches else None

    def floor(self) -> int:
        """Victims must have a batch number below this: the oldest batch in flight."""
        with self._lock:
            self._collect()
            return min(self._in_flight) if self._in_flight else self._next

    def in_flight(self) -> int:
        """Batches in flight (pending prefetches included)."""
        with self._lock:
            self._collect()
            return len(self._in_flight)

    def _collect(self) -> None:
        while self._dropped:
            batch, payload = self._dropped.popleft()
            self._in_flight.discard(batch)
            if payload is not None:
                self._dropped_payloads.append(payload)

    def _new(self) -> int:
        b = self._next
        self._next += 1
        self._in_flight.add(b)
        return b


__all__ = ["MAX_PENDING_PREFETCHES", "BatchHold", "BatchLedger"]
