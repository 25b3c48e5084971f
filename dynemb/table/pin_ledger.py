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
graph dropped unused) is released when it is garbage-collected.

Numbers grow by one per batch, from 1 (0, the pin of a fresh slot, is never in
flight). Before they reach ``_ops.NO_PINS`` the ledger renumbers: pins of batches
in flight move down to start at 1, older pins become 0 (one pass over the table's
pins, once per ~4 billion batches).
"""

import threading
import weakref

import torch

from dynemb import _ops


class PinHold:
    """The pin number of one batch in flight; ``release()`` ends it (idempotent)."""

    __slots__ = ("number", "_ledger", "__weakref__")

    def __init__(self, ledger: "PinLedger", number: int) -> None:
        self.number = number
        self._ledger = ledger

    def release(self) -> None:
        ledger, self._ledger = self._ledger, None
        if ledger is not None:
            ledger.release(self)

    def __del__(self) -> None:
        self.release()


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
        self._held: weakref.WeakSet[PinHold] = weakref.WeakSet()

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
            if self._next >= self._limit:
                self._renumber(pins)
            hold = PinHold(self, self._next)
            self._next += 1
            self._held.add(hold)
        return hold

    def release(self, hold: PinHold) -> None:
        with self._lock:
            self._held.discard(hold)

    def floor(self) -> int:
        """Residents pinned at or above this number are not evicted: the oldest batch
        in flight, or the next number when none is."""
        with self._lock:
            return min((h.number for h in self._held), default=self._next)

    def in_flight(self) -> int:
        """Batches in flight."""
        with self._lock:
            return len(self._held)

    def _renumber(self, pins: torch.Tensor) -> None:
        floor = min((h.number for h in self._held), default=self._next)
        shift = floor - 1
        if pins.numel():
            # int32 storage of uint32 numbers: compare as int64.
            wide = pins.to(torch.int64) & 0xFFFFFFFF
            wide = torch.where(wide >= floor, wide - shift, torch.zeros_like(wide))
            pins.copy_(wide.to(torch.int32))
        for h in self._held:
            h.number -= shift
        self._next -= shift
        if self._next >= self._limit:
            raise RuntimeError(
                f"dynemb: {self._next - 1} batches are in flight in one table, the most its "
                f"pin numbers can tell apart; release their backward or drop their outputs"
            )


__all__ = ["PinHold", "PinLedger"]
