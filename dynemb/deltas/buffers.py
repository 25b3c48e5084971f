"""``CaptureBuffers``: host buffers a publisher reuses from one delta to the next.

A delta's capture copies every touched row into host memory of the publisher's own,
on the training thread. Into a fresh buffer, most of that time was page faults: on
W-train (4.4M rows of 65 floats, 1 training thread) the gather took 0.96 s into a
fresh output and 0.27 s into one already touched. So a capture takes its buffers
from here, and a delta's buffers come back once it is written (or failed): from the
second delta on, a capture of about the same size faults no page.

The KEEP largest free buffers are kept per name (a table's field). A buffer is never
handed out twice: the delta that holds it owns it until ``give``. ``reserve``, on the
writer thread between deltas, makes a buffer ready (its pages touched) before a capture
needs it: the first delta, and one larger than any before, then fault no page either.
"""

import threading
import weakref

import torch

from dynemb.table.table_storage import allocate

HEADROOM = 1.25  # a new buffer holds this many times the rows asked: deltas vary a little
# A reserved buffer holds this many times the rows asked: a reservation follows a
# growing estimate, so a geometric step keeps the reallocations few.
GROWTH = 1.5
# Free buffers kept per name: a capture while the previous delta is still being
# written (it holds its buffers) then finds one too, once two were ever needed.
KEEP = 2


class CaptureBuffers:
    """Free host buffers by name (see the module)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._free: dict[str, list[torch.Tensor]] = {}  # by name, largest first
        # Buffers handed out, by address, and their names; weak: one never given back
        # (a delta dropped after a failed write) is freed with the last view of it.
        self._lent: weakref.WeakValueDictionary[int, torch.Tensor] = weakref.WeakValueDictionary()
        self._names: dict[int, str] = {}

    def take(self, name: str, rows: int, width: int, dtype: torch.dtype) -> torch.Tensor:
        """A (rows, width) host tensor of ``dtype`` (``width`` 0: a (rows,) one), a view of
        the free buffer ``name`` when it is large enough and of ``dtype``, else new."""
        numel = rows * max(width, 1)
        with self._lock:
            free = self._free.get(name, [])
            buffer = free.pop(0) if free else None
        if buffer is None or buffer.dtype != dtype or buffer.numel() < numel:
            buffer = allocate((int(numel * HEADROOM) + 1,), dtype, torch.device("cpu"))
        with self._lock:
            self._lent[buffer.data_ptr()] = buffer
            self._names[buffer.data_ptr()] = name
        view = buffer[:numel]
        return view.view(rows, width) if width else view

    def reserve(self, name: str, rows: int, width: int, dtype: torch.dtype) -> bool:
        """Makes sure a free buffer ``name`` holds ``rows`` rows (see ``take``): else
        allocates one of GROWTH times as many and touches its pages here (the calling
        thread's time, not the capture's). Returns whether it allocated."""
        numel = rows * max(width, 1)
        with self._lock:
            free = self._free.get(name, [])
            if any(b.dtype == dtype and b.numel() >= numel for b in free):
                return False
        buffer = allocate((int(numel * GROWTH) + 1,), dtype, torch.device("cpu"))
        buffer.zero_()  # every page faulted now
        self._keep(name, buffer)
        return True

    def give(self, tensor: torch.Tensor) -> None:
        """Hands back the buffer under ``tensor`` (a view of one ``take`` returned; any
        other tensor is ignored) to its name's free ones (the KEEP largest stay)."""
        address = tensor.untyped_storage().data_ptr()
        with self._lock:
            base = self._lent.pop(address, None)
            name = self._names.pop(address, None)
        if base is not None and name is not None:
            self._keep(name, base)

    def _keep(self, name: str, buffer: torch.Tensor) -> None:
        """Adds ``buffer`` to the free ones of ``name`` (the KEEP largest stay)."""
        with self._lock:
            free = self._free.setdefault(name, [])
            free.append(buffer)
            free.sort(key=lambda b: -b.numel())
            del free[KEEP:]

    def out(self, prefix: str):
        """``out(field, rows, width, dtype)``: ``take`` of ``<prefix>.<field>`` (the
        ``out`` argument of ScoredHashTable.stored_entries and precapture's reads)."""

        def take(field: str, rows: int, width: int, dtype: torch.dtype) -> torch.Tensor:
            return self.take(f"{prefix}.{field}", rows, width, dtype)

        return take

    def give_delta(self, delta) -> None:
        """``give`` of every field of a TableDelta (those not lent are ignored)."""
        for field in ("keys", "values", "scores", "state", "timestamps", "tombstones"):
            tensor = getattr(delta, field)
            if tensor is not None:
                self.give(tensor)

    def clear(self) -> None:
        """Frees every buffer."""
        with self._lock:
            self._free.clear()
            self._lent.clear()
            self._names.clear()


__all__ = ["CaptureBuffers"]
