"""Device streams, as the tables' ordering sees them (dynemb/table/stream_order.py).

A GPU runs the work of one stream in order and the work of different streams in any
order, unless an event orders them. dynemb's table ops assume one op on a table at a
time, and a table's guard (rw_lock.py) orders only the host's enqueueing: so every
op on a table whose stream differs from the streams of the table's earlier ops
first waits for them through events.

``backend(device)`` gives the three calls that ordering needs (the current stream,
an event after a stream's work so far, a wait of a stream for an event):

- a table on a GPU: torch.cuda's streams and events;
- a table in host memory: None, no stream exists and an op runs when it is called
  (the ordering then costs one call per table op); unless the stream model of
  dynemb.emulated_streams is active, which gives the emulated executor's tests
  streams that run out of order, so that a missing event fails a test.
"""

from collections.abc import Iterable
from typing import Any, Protocol

import torch


class StreamBackend(Protocol):
    """Streams and events of one kind of device."""

    def current(self, device: torch.device) -> Any:
        """The stream that ops on ``device`` are queued on now (the calling thread's)."""

    def event_after(self, stream: Any) -> Any:
        """An event that completes once the work queued on ``stream`` so far is done."""

    def wait(self, stream: Any, event: Any) -> None:
        """Work queued on ``stream`` from now on starts after ``event``."""

    def keep_for(self, tensor: torch.Tensor, stream: Any) -> None:
        """``tensor``'s memory is not reused before the work queued on ``stream`` so
        far is done, wherever it is freed (the caching allocator's record_stream)."""

    def is_stream(self, stream: Any) -> bool:
        """Whether ``stream`` is a stream of this backend."""


class CudaStreams:
    """torch.cuda's streams and events (a table on a GPU)."""

    def current(self, device: torch.device) -> torch.cuda.Stream:
        return torch.cuda.current_stream(device)

    def event_after(self, stream: torch.cuda.Stream) -> torch.cuda.Event:
        event = torch.cuda.Event()
        event.record(stream)
        return event

    def wait(self, stream: torch.cuda.Stream, event: torch.cuda.Event) -> None:
        stream.wait_event(event)

    def keep_for(self, tensor: torch.Tensor, stream: torch.cuda.Stream) -> None:
        if tensor.device.type == "cuda":
            tensor.record_stream(stream)

    def is_stream(self, stream: Any) -> bool:
        return isinstance(stream, torch.Stream | torch.cuda.Stream)


_CUDA = CudaStreams()
# The active host stream model (dynemb.emulated_streams), or None: host tables run
# their ops at once. One at a time, set and cleared by that module.
_host_model: StreamBackend | None = None


def backend(device: torch.device) -> StreamBackend | None:
    """The streams of ``device``'s tables: torch.cuda's on a GPU; on the host, the
    active stream model, else None (no streams: nothing to order)."""
    if device.type == "cuda":
        return _CUDA
    return _host_model


def host_model() -> StreamBackend | None:
    """The active host stream model (dynemb.emulated_streams), or None."""
    return _host_model


def set_host_model(model: StreamBackend | None) -> StreamBackend | None:
    """Makes ``model`` (or None) the host's streams; returns the previous one. Only
    dynemb.emulated_streams calls it."""
    global _host_model
    previous, _host_model = _host_model, model
    return previous


def host_read(tensor: torch.Tensor) -> None:
    """The host is about to read ``tensor``'s values (dynemb._host_reads.read_to_host):
    under the host stream model, the current stream's work runs first, as a GPU's
    device-to-host copy waits for its stream. A no-op otherwise (on a GPU the copy
    itself waits)."""
    model = _host_model
    if model is not None and tensor.device.type != "cuda":
        model.synchronize_current()  # type: ignore[attr-defined]


def check_stream(device: torch.device, stream: Any, name: str = "forward_stream") -> None:
    """Raises TypeError unless ``stream`` is None or a stream of ``device`` (anything
    passes where ``device`` has no streams: the host without a stream model)."""
    streams = backend(device)
    if stream is not None and streams is not None and not streams.is_stream(stream):
        raise TypeError(
            f"{name} must be None or a stream of {device} ({type(streams).__name__}), "
            f"got {stream!r}"
        )


def hand_over(
    device: torch.device, forward_stream: Any, tensors: Iterable[torch.Tensor] = ()
) -> None:
    """Work queued on the current stream of ``device`` so far (a prefetch) comes before
    whatever ``forward_stream`` runs from now on, and ``tensors`` (what that work
    leaves for it) stay allocated until ``forward_stream``'s work queued now is done.

    Args:
        device: the device of the work handed over.
        forward_stream: None (the same stream uses it: nothing to do) or a stream of
            ``device`` (TorchRec's prefetch pipeline passes its default stream).
        tensors: tensors made by that work and read on ``forward_stream``.

    Raises:
        TypeError: ``forward_stream`` is not a stream of ``device``.
    """
    check_stream(device, forward_stream)
    streams = backend(device)
    if forward_stream is None or streams is None:
        return
    current = streams.current(device)
    if forward_stream == current:
        return
    streams.wait(forward_stream, streams.event_after(current))
    for tensor in tensors:
        streams.keep_for(tensor, forward_stream)


def used_here(tensors: Iterable[torch.Tensor]) -> None:
    """``tensors``, made on another stream (a prefetch's), are read on the current one:
    their memory is not reused before the work queued on it so far is done (a no-op
    without streams)."""
    for tensor in tensors:
        streams = backend(tensor.device)
        if streams is not None:
            streams.keep_for(tensor, streams.current(tensor.device))


__all__ = [
    "CudaStreams", "StreamBackend", "backend", "check_stream", "hand_over", "host_model",
    "host_read", "set_host_model", "used_here",
]  # fmt: skip
