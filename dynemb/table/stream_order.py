"""``StreamOrder``: a table's ops run one after another on the device, whatever their stream.

The ops' lock-free passes assume one op on a table at a time (a tile kernel's pass 1
takes no bucket lock; growth replaces every buffer). The table's guard (rw_lock.py)
orders the host's *enqueueing*; a GPU runs two streams' work in any order, so an op
queued on another stream than the table's earlier ops first waits for them:

- a reader waits for the last writer's stream (readers of several streams may then
  run together, as on the host);
- a writer waits for the last writer's stream and every reader's stream since.

The event of a wait is recorded when the waiting op enters the guard, at the end of
the other stream's queue: the table's earlier ops are in it (the guard let them in
first), maybe followed by other work (waited for too: harmless). So a table used on
one stream records no event at all; the cost is one backend call per op, and on the
host, where no stream exists (dynemb.streams.backend is None), one function call.

A new table's buffers were filled on the stream current at its construction: that
stream is its first writer. What a table's ops leave for later users is ordered the
same way: a pin released on the host (pin_ledger.py) or a staging slot freed
(dynemb.tiering.staging) is reused only by a later op on the table, which waits for
the ops that read it. Buffers that growth replaces are handed to the growth's stream
(``retire``), which waited for every earlier user, so their memory is not reused
before it is done.

Concurrency: the guard calls ``enter`` under its own lock (readers enter one at a
time, a writer alone), so the fields need no lock of their own.
"""

from collections.abc import Iterable

import torch

from dynemb import streams


class StreamOrder:
    """The streams of one table's ops since its last writer (see the module doc).

    Args:
        device: the table's device (None: the host's).
    """

    __slots__ = ("_device", "_host", "_writer", "_after_write", "_readers")

    def __init__(self, device: torch.device | str | None = None) -> None:
        self._device = torch.device(device if device is not None else "cpu")
        self._host = self._device.type != "cuda"
        backend = streams.backend(self._device)
        # The last writer's stream (None: none yet); the table's buffers were filled
        # on the current stream, which so counts as its first writer.
        self._writer = backend.current(self._device) if backend is not None else None
        # Streams ordered after it (its own included), and those that read since it.
        self._after_write: tuple = () if self._writer is None else (self._writer,)
        self._readers: tuple = ()

    def enter(self, write: bool) -> None:
        """An op on the table is about to be queued on the current stream."""
        # The host has no streams unless a stream model is active: one call.
        backend = streams.host_model() if self._host else streams.backend(self._device)
        if backend is None:
            return
        stream = backend.current(self._device)
        if write:
            others = self._readers if self._writer is None else (self._writer, *self._readers)
            for other in _distinct(others):
                if other != stream:
                    backend.wait(stream, backend.event_after(other))
            self._writer, self._after_write, self._readers = stream, (stream,), ()
            return
        if stream not in self._after_write:
            if self._writer is not None:
                backend.wait(stream, backend.event_after(self._writer))
            self._after_write = (*self._after_write, stream)
        if stream not in self._readers:
            self._readers = (*self._readers, stream)

    def retire(self, tensors: Iterable[torch.Tensor]) -> None:
        """Buffers a writer replaced (growth): their memory is reused only after the
        writer's stream is done with them (it waited for every earlier user)."""
        backend = streams.backend(self._device)
        if backend is None:
            return
        stream = backend.current(self._device)
        for tensor in tensors:
            backend.keep_for(tensor, stream)


def _distinct(items: tuple) -> list:
    out: list = []
    for item in items:
        if item not in out:
            out.append(item)
    return out


__all__ = ["StreamOrder"]
