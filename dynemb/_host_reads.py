"""The training path's reads of device values, counted, and reads deferred to the next.

On a GPU, each read of a tensor's values by the host waits for the stream: the
host stops queueing work until the device has caught up. A training step
(``BatchedDynamicEmbeddingTables`` forward and backward, the tables' and caches'
lookups) reads device values only through ``read_to_host``, and the ops only
through their backend's ``to_host`` (csrc/torch/cuda_backend.h, counted by the
emulated executor), so ``host_reads()`` counts a step's waits on every executor:
tests/tbe/test_host_reads.py holds them to a budget per step, and a lint test there
finds any other read in those files.

A value the host needs later, not now (the status counts of a lookup that cannot
grow its table: what they change is bookkeeping), is a ``DeferredRead``: the next
``read_to_host`` of its device packs it into its own read, so it costs no wait of
its own; ``value()`` reads it at once (one counted read) if none came yet.
"""

import collections
import threading

import torch

from dynemb import _executor, streams

_lock = threading.Lock()
_reads: collections.Counter = collections.Counter()
_pending: list = []  # DeferredReads not read yet, in deferral order


class DeferredRead:
    """A device tensor read by the next ``read_to_host`` of its device."""

    def __init__(self, tensor: torch.Tensor, why: str) -> None:
        self.tensor: torch.Tensor | None = tensor  # None once read
        self.why = why
        self._host: torch.Tensor | None = None
        self._done = threading.Event()
        with _lock:
            _pending.append(self)

    def deliver(self, host: torch.Tensor) -> None:
        """Called by the read that took it: its value in host memory."""
        self._host, self.tensor = host, None
        self._done.set()

    def __getstate__(self) -> dict:  # a copy (deepcopy, pickle) is read already
        return {"why": self.why, "host": self.value()}

    def __setstate__(self, state: dict) -> None:
        self.tensor, self.why = None, state["why"]
        self._host, self._done = state["host"], threading.Event()
        self._done.set()

    @property
    def ready(self) -> bool:
        """Whether a read took it already (``value()`` then waits for nothing)."""
        return self._done.is_set()

    def value(self) -> torch.Tensor:
        """The tensor in host memory; reads it now (counted) if no read took it yet."""
        if self._host is None:
            with _lock:
                if self in _pending:
                    _pending.remove(self)
                    riders = [self]
                else:  # another thread's read is taking it: wait for that read
                    riders = []
            if riders:
                self.deliver(_read_packed(self.tensor, [], f"deferred {self.why}"))
            self._done.wait()
        return self._host


def read_to_host(tensor: torch.Tensor, why: str) -> torch.Tensor:
    """``tensor`` in host memory (itself when it is there already), counted as one
    read; ``why`` names what the host needs it for (``host_reads_by_reason``). The
    pending ``DeferredRead``s of its device are read in the same copy."""
    with _lock:
        riders = [d for d in _pending if d.tensor.device == tensor.device]
        for d in riders:
            _pending.remove(d)
    return _read_packed(tensor, riders, why)


def _read_packed(tensor: torch.Tensor, riders: list, why: str) -> torch.Tensor:
    """One read of ``tensor`` and the riders' tensors, their bytes concatenated."""
    with _lock:
        _reads[why] += 1
    if not riders:
        host = tensor.cpu()
        streams.host_read(tensor)  # a host stream model runs the stream's work now
        return host
    parts = [tensor] + [d.tensor for d in riders]
    flat = [p.contiguous().reshape(-1).view(torch.uint8) for p in parts]
    host = torch.cat(flat).cpu()
    start, out = 0, []
    for part, bytes_ in zip(parts, flat, strict=True):
        end = start + bytes_.numel()
        out.append(host[start:end].clone().view(part.dtype).reshape(part.shape))
        start = end
    streams.host_read(tensor)  # as above: the packed copy and its slices are written
    for d, value in zip(riders, out[1:], strict=True):
        d.deliver(value)
    return out[0]


def host_reads() -> int:
    """Reads of device values since the process started: ``read_to_host``'s (and
    ``DeferredRead.value``'s), plus the emulated executor's ops' own (the sizes of
    their outputs) when it runs."""
    with _lock:
        total = sum(_reads.values())
    if _executor.executor() == "cuda-emulated":
        total += _executor.emulation_counters()["host_reads"]
    return total


def host_reads_by_reason() -> dict[str, int]:
    """``read_to_host``'s reads since the process started, by ``why``."""
    with _lock:
        return dict(_reads)
