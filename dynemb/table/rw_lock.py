"""A table's guard: a readers-writer lock that also orders the device's streams.

The C++ ops that change a table lock buckets, but readers take no lock (see
csrc/core/platform.h), and growth replaces every buffer: so a table lets many
readers in at once and a writer only alone. Writers are preferred, so a stream of
readers cannot starve them.

The lock orders the host's enqueueing only; on a GPU, an op entering on another
stream than the table's earlier ops waits for them through events
(stream_order.py), so the device runs them in the order the lock let them in.
"""

import contextlib
import threading

import torch

from dynemb.table.stream_order import StreamOrder


class RWLock:
    """Many readers or one writer; ``order`` orders their device streams.

    Args:
        device: the device of the buffers it guards (None: the host's).
    """

    def __init__(self, device: torch.device | str | None = None) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._readers = 0
        self._writer = False
        self._writers_waiting = 0
        self.order = StreamOrder(device)

    @contextlib.contextmanager
    def read(self):
        with self._cond:
            while self._writer or self._writers_waiting:
                self._cond.wait()
            self._readers += 1
            try:
                self.order.enter(write=False)
            except BaseException:
                self._readers -= 1
                self._cond.notify_all()
                raise
        try:
            yield
        finally:
            with self._cond:
                self._readers -= 1
                if self._readers == 0:
                    self._cond.notify_all()

    @contextlib.contextmanager
    def write(self):
        with self._cond:
            self._writers_waiting += 1
            while self._writer or self._readers:
                self._cond.wait()
            self._writers_waiting -= 1
            self._writer = True
            try:
                self.order.enter(write=True)
            except BaseException:
                self._writer = False
                self._cond.notify_all()
                raise
        try:
            yield
        finally:
            with self._cond:
                self._writer = False
                self._cond.notify_all()
