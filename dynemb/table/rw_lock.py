"""A table's guard: a readers-writer lock that also orders the device's streams.

The C++ ops that change a table lock buckets, but readers take no lock (see
csrc/core/platform.h), and growth replaces every buffer: so a table lets many
readers in at once and a writer only alone. Writers are preferred, so a stream of
readers cannot starve them.

The lock orders the host's enqueueing only; on a GPU, an op entering on another
stream than the table's earlier ops waits for them through events
(stream_order.py), so the device runs them in the order the lock let them in.
"""

import threading

import torch

from dynemb.table.stream_order import StreamOrder


class RWLock:
    """Many readers or one writer; ``order`` orders their device streams.

    ``read()`` and ``write()`` are context managers (plain objects, not generators: a
    training step takes a table's lock several times, and each generator-based
    context costs a few Python calls more); a release wakes the waiting threads only
    when there are some.

    Args:
        device: the device of the buffers it guards (None: the host's).
    """

    def __init__(self, device: torch.device | str | None = None) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._readers = 0
        self._writer = False
        self._writers_waiting = 0
        self._waiting = 0  # threads in self._cond.wait()
        self.order = StreamOrder(device)
        self._read_guard = _Guard(self._acquire_read, self._release_read)
        self._write_guard = _Guard(self._acquire_write, self._release_write)

    def read(self) -> "_Guard":
        """The lock held by a reader while in the ``with`` block."""
        return self._read_guard

    def write(self) -> "_Guard":
        """The lock held by the writer (alone) while in the ``with`` block."""
        return self._write_guard

    def _wait(self) -> None:
        self._waiting += 1
        try:
            self._cond.wait()
        finally:
            self._waiting -= 1

    def _wake(self) -> None:
        if self._waiting:
            self._cond.notify_all()

    def _acquire_read(self) -> None:
        with self._cond:
            while self._writer or self._writers_waiting:
                self._wait()
            self._readers += 1
            try:
                self.order.enter(write=False)
            except BaseException:
                self._readers -= 1
                self._wake()
                raise

    def _release_read(self) -> None:
        with self._cond:
            self._readers -= 1
            if self._readers == 0:
                self._wake()

    def _acquire_write(self) -> None:
        with self._cond:
            self._writers_waiting += 1
            try:
                while self._writer or self._readers:
                    self._wait()
            finally:
                self._writers_waiting -= 1
            self._writer = True
            try:
                self.order.enter(write=True)
            except BaseException:
                self._writer = False
                self._wake()
                raise

    def _release_write(self) -> None:
        with self._cond:
            self._writer = False
            self._wake()


class _Guard:
    """``RWLock.read()`` or ``write()``: stateless, so one per lock and mode serves
    every thread and every nesting."""

    __slots__ = ("_acquire", "_release")

    def __init__(self, acquire, release) -> None:
        self._acquire, self._release = acquire, release

    def __enter__(self) -> None:
        self._acquire()

    def __exit__(self, *exc) -> None:
        self._release()
