"""``PinLedger``: the pin numbers of one table's batches in flight.

Every batch upsert of an evicting table writes its pin number into the slots it
finds or claims, and evicts only residents whose pin is below the *floor*, the
number of the oldest batch still in flight (csrc/core/table_ops.h, "Pins"). So no
key of a batch in flight is evicted: a lookup reads its own key's row, and a
training forward's backward writes each gradient into its own key's row.

A batch is in flight from its upsert until its ``PinHold`` is released: at the end
of the upsert for a one-off batch (find_or_insert, insert_or_assign, a cache
claim), or when its backward has run for a training forward of
BatchedDynamicEmbeddingTables. A hold whose forward never gets a backward (a
graph dropped unused) is released when it is garbage-collected: its weak
reference's callback only queues its token (an atomic deque append, no lock: the
collector may run it at any allocation of its thread, even inside this ledger's
lock), and the ledger forgets it at its next call.

Numbers grow by one per batch, from 1 (0, the pin of a fresh slot, is never in
flight). Before they reach ``_ops.NO_PINS`` the ledger renumbers: pins of batches
in flight move down to start at 1, older pins become 0 (one pass over the table's
pins, once per ~4 billion batches).
"""

import collections
import itertools
import threading
import weakref

import torch

from dynemb import _ops


class PinHold:
    """The pin number of one batch in flight; ``release()`` ends it (idempotent).

    It has no finalizer: when it is collected unreleased, its ledger's weak reference
    to it queues its ``token`` (``PinLedger``)."""

    __slots__ = ("number", "token", "_ledger", "__weakref__")

    def __init__(self, ledger: "PinLedger", number: int, token: int) -> None:
        self.number = number
        self.token = token
        self._ledger = ledger

    def release(self) -> None:
        ledger, self._ledger = self._ledger, None
        if ledger is not None:
            ledger.release(self)


class PinLedger:
    """Pin numbers of one table's batches in flight (thread-safe).

    Args:
        limit: the first number never handed out (renumbering happens before it);
            tests lower it to reach a renumbering quickly.
    """

    def __init__(self, limit: int = _ops.NO_PINS) -> None:
        self._lock = threading.Lock()
        self._limit = limit
        self._next = 1
        self._tokens = itertools.count()
        # token -> weak reference of each hold in flight; the reference's callback
        # appends the token to _collected (no lock), _forget_collected drops it.
        self._held: dict[int, weakref.ref[PinHold]] = {}
        self._collected: collections.deque[int] = collections.deque()

    def __getstate__(self) -> dict:
        # A copy (deepcopy, pickle) of a table has no batch in flight: its holds stay
        # with the original, and its floor passes every pin it copied.
        return {"limit": self._limit, "next": self._next}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["limit"])
        self._next = state["next"]

    def hold(self, pins: torch.Tensor) -> PinHold:
        """A new batch in flight. ``pins``: the table's pins buffer (renumbered in
        place when the numbers run out)."""
        with self._lock:
            self._forget_collected()
            if self._next >= self._limit:
                self._renumber(pins)
            token = next(self._tokens)
            hold = PinHold(self, self._next, token)
            self._held[token] = weakref.ref(hold, _queue_token(self._collected, token))
            self._next += 1
        return hold

    def release(self, hold: PinHold) -> None:
        with self._lock:
            self._forget_collected()
            self._held.pop(hold.token, None)

    def floor(self) -> int:
        """Residents pinned at or above this number are not evicted: the oldest batch
        in flight, or the next number when none is."""
        with self._lock:
            self._forget_collected()
            return min((h.number for h in self._live()), default=self._next)

    def in_flight(self) -> int:
        """Batches in flight."""
        with self._lock:
            self._forget_collected()
            return sum(1 for _ in self._live())

    def _live(self) -> list[PinHold]:
        # Strong references for the caller's loop: a hold collected meanwhile (its
        # callback queues it) is skipped, or kept alive until the loop ends.
        return [h for h in (ref() for ref in self._held.values()) if h is not None]

    def _forget_collected(self) -> None:
        while self._collected:
            self._held.pop(self._collected.popleft(), None)

    def _renumber(self, pins: torch.Tensor) -> None:
        holds = self._live()
        floor = min((h.number for h in holds), default=self._next)
        shift = floor - 1
        if pins.numel():
            # int32 storage of uint32 numbers: compare as int64.
            wide = pins.to(torch.int64) & 0xFFFFFFFF
            wide = torch.where(wide >= floor, wide - shift, torch.zeros_like(wide))
            pins.copy_(wide.to(torch.int32))
        for h in holds:
            h.number -= shift
        self._next -= shift
        if self._next >= self._limit:
            raise RuntimeError(
                f"dynemb: {self._next - 1} batches are in flight in one table, the most its "
                f"pin numbers can tell apart; release their backward or drop their outputs"
            )


def _queue_token(collected: collections.deque, token: int):
    """The weak-reference callback of one hold: queues its token, takes no lock (a
    finalizer may run inside any locked region of its thread)."""

    def queue(_ref: weakref.ref) -> None:
        collected.append(token)

    return queue


__all__ = ["PinHold", "PinLedger"]
