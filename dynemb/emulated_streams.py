"""A stream model for the emulated executor: host work that runs out of order.

On a GPU the host queues work on streams and returns; the device runs each stream's
work in order and the work of different streams in any order, except where a stream
waits for another's event. The emulated executor (``DYNEMB_EXECUTOR=cuda-emulated``)
runs every op when it is called, so a missing event cannot fail there. Under
``emulated_streams()`` it can:

- **Each stream is a queue.** Every torch op issued by the calling thread (aten's and
  dynemb's: a ``TorchDispatchMode`` sees them all) is appended to the current
  stream's queue instead of running; it returns its outputs at once, allocated and
  not yet written, as a GPU op does. Ops that only change metadata (views) run at
  once.
- **Events are the only order between queues.** ``event_after`` and ``wait`` (the
  calls dynemb.streams gives the tables' ordering, the same code path that orders
  torch.cuda streams) put a record and a wait into the queues.
- **Queues interleave by the seed.** ``synchronize()`` (and leaving the block) runs
  every queue to its end, one op at a time, the next queue drawn from a random
  generator seeded by ``DYNEMB_EMULATION_SEED`` (or ``seed``) among those whose head
  may run.
- **A host read waits for its stream only.** An op whose outputs' sizes depend on
  values (``nonzero``, ``.item()``, dynemb ops that read the device), and
  ``dynemb._host_reads.read_to_host``, first run the current stream's queue, and of
  other queues only what it waits for, then run at once; the other streams' work
  stays queued, as a GPU's would.

dynemb's table ops without a shape function of their own (the lookup ops have fake
kernels) get their outputs' shapes from ``_OUTPUTS`` below; other dynemb ops run as
host reads. One host thread issues the work (the dispatch mode is the thread's);
memory is never reused early here (a queued op holds its tensors), so what
``keep_for`` guards on a GPU is not modelled. What only a GPU shows (real
concurrency inside a kernel, TorchRec's prefetch stream end to end) is tested there
(docs/gpu.md).

Example::

    with emulated_streams() as model:
        side = model.new_stream("side")
        with model.use(side):
            values, found = table.find(keys)      # queued on side
        table.insert_or_assign(keys, new_values)  # waits for side's find (its event)
    # leaving the block ran every queue
"""

import collections
import contextlib
import os
import random
import threading
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from dynemb import _ops, streams

# Output shapes of dynemb's table ops that have no fake kernel: name -> f(args) ->
# [(shape, dtype)] (the op contracts of dynemb/_ops.py).


def _upsert_outputs(*dtypes):
    def shapes(args: tuple) -> list:
        n = args[3].shape[0]  # keys
        return [*(((n,), d) for d in dtypes), ((_ops.STATUS_COUNT,), torch.int64)]

    return shapes


_OUTPUTS: dict[str, Callable[[tuple], list]] = {
    "table_find": lambda a: [((a[1].shape[0],), torch.bool)],
    "table_erase": lambda a: [((a[1].shape[0],), torch.bool)],
    "hash_keys": lambda a: [((a[0].shape[0],), torch.int64), ((a[0].shape[0],), torch.uint8)],
    "table_find_or_insert": _upsert_outputs(torch.int8),
    "table_insert_or_assign": _upsert_outputs(torch.int8),
    "table_restore": _upsert_outputs(torch.int8),
    "table_find_or_insert_slots": _upsert_outputs(torch.int64, torch.int8),
    "embedding_pool_into": lambda a: [],
    "embedding_pool_into_grouped": lambda a: [],
    "embedding_backward": lambda a: [],
    "embedding_backward_grouped": lambda a: [],
}
_DYNEMB_LIBRARIES = ("dynemb", "dynemb_cuda_emulated")
# In-place ops that change a tensor's size or storage: they run as host reads (their
# effect on the metadata is needed at once, and the data they copy must be written).
_METADATA_WRITES = frozenset(
    f"aten::{n}" for n in ("resize_", "resize_as_", "set_", "as_strided_", "detach_")
)


class EmulatedEvent:
    """A point in one emulated stream's queue; done once the queue ran past it."""

    __slots__ = ("stream", "done")

    def __init__(self, stream: "EmulatedStream") -> None:
        self.stream = stream
        self.done = False


class EmulatedStream:
    """An in-order queue of work (ops, event records, waits) of one StreamModel."""

    def __init__(self, model: "StreamModel", name: str) -> None:
        self.model = model
        self.name = name
        self.queue: collections.deque = collections.deque()

    def __repr__(self) -> str:
        return f"EmulatedStream({self.name!r}, {len(self.queue)} queued)"


class StreamModel(TorchDispatchMode):
    """Emulated streams over host tensors (see the module doc); the host stream
    backend of dynemb.streams while ``emulated_streams()`` is active.

    Args:
        seed: draws the queues' interleaving (None: ``DYNEMB_EMULATION_SEED``, else 0).
    """

    def __init__(self, seed: int | None = None) -> None:
        super().__init__()
        if seed is None:
            seed = int(os.environ.get("DYNEMB_EMULATION_SEED", "0") or 0)
        if not isinstance(seed, int):
            raise TypeError(f"seed must be an int, got {seed!r}")
        self.seed = seed
        self._random = random.Random(seed)
        self.default = EmulatedStream(self, "default")
        self._streams = [self.default]
        self._current = self.default
        self._running = False  # queued work is running: its ops run, not queued
        self._thread = threading.get_ident()
        self.queued_ops = 0  # ops queued since the start (tests check work was queued)

    # ---------------------------------------------------------------- streams

    def new_stream(self, name: str | None = None) -> EmulatedStream:
        """A new stream (a queue of its own)."""
        stream = EmulatedStream(self, name or f"stream{len(self._streams)}")
        self._streams.append(stream)
        return stream

    @contextlib.contextmanager
    def use(self, stream: EmulatedStream) -> Iterator[EmulatedStream]:
        """Queues the block's work on ``stream`` (as ``torch.cuda.stream(stream)``)."""
        if not isinstance(stream, EmulatedStream) or stream.model is not self:
            raise TypeError(f"stream must be an EmulatedStream of this model, got {stream!r}")
        previous, self._current = self._current, stream
        try:
            yield stream
        finally:
            self._current = previous

    # ------------------------------------------- dynemb.streams.StreamBackend

    def current(self, device: torch.device) -> EmulatedStream:
        if threading.get_ident() != self._thread:  # its ops would not be queued
            raise RuntimeError(
                "dynemb: emulated streams take the work of the thread that started them; "
                "a table op came from another thread"
            )
        return self._current

    def event_after(self, stream: EmulatedStream) -> EmulatedEvent:
        event = EmulatedEvent(stream)
        stream.queue.append(("record", event))
        return event

    def wait(self, stream: EmulatedStream, event: EmulatedEvent) -> None:
        stream.queue.append(("wait", event))

    def keep_for(self, tensor: torch.Tensor, stream: EmulatedStream) -> None:
        return None  # a queued op holds its tensors: memory is never reused early

    def is_stream(self, stream: Any) -> bool:
        return isinstance(stream, EmulatedStream) and stream.model is self

    # ------------------------------------------------------------ running work

    def synchronize(self) -> None:
        """Runs every queue to its end, interleaved by the seed (a device sync)."""
        while True:
            ready = [s for s in self._streams if s.queue and self._may_run(s)]
            if not ready:
                if any(s.queue for s in self._streams):  # cannot happen: waits follow records
                    raise RuntimeError("dynemb: emulated streams wait for each other")
                return
            self._step(self._random.choice(ready))

    def synchronize_current(self) -> None:
        """Runs the current stream's queue to its end, and of the others only the work
        it waits for (a host read of the current stream)."""
        self._drain(self._current)

    def _drain(self, stream: EmulatedStream) -> None:
        while stream.queue:
            kind, item = stream.queue[0]
            if kind == "wait" and not item.done:
                self._run_until(item)
            else:
                self._step(stream)

    def _run_until(self, event: EmulatedEvent) -> None:
        stream = event.stream
        while not event.done:
            kind, item = stream.queue[0]
            if kind == "wait" and not item.done:
                self._run_until(item)
            else:
                self._step(stream)

    @staticmethod
    def _may_run(stream: EmulatedStream) -> bool:
        kind, item = stream.queue[0]
        return kind != "wait" or item.done

    def _step(self, stream: EmulatedStream) -> None:
        kind, item = stream.queue.popleft()
        if kind == "record":
            item.done = True
        elif kind == "op":
            previous, self._running = self._running, True
            try:
                item()
            finally:
                self._running = previous

    # -------------------------------------------------------------- queueing

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self._running or func.is_view:
            return func(*args, **kwargs)  # running queued work, or metadata only
        outputs = None if func.name() in _METADATA_WRITES else _outputs(func, args, kwargs)
        if outputs is None:  # its outputs need values: a host read of the stream
            self._drain(self._current)
            return func(*args, **kwargs)
        result, fresh = outputs

        def run() -> None:
            done = func(*args, **kwargs)
            for out, value in zip(fresh, _leaves(done), strict=False):
                if out is not None:
                    out.copy_(value)

        self._current.queue.append(("op", run))
        self.queued_ops += 1
        return result


def _outputs(func, args: tuple, kwargs: dict):
    """``(result, fresh)``: what the op returns now (its aliased inputs, and new
    tensors for the rest) and, per tensor it returns, the new tensor its values are
    copied into once it ran (None: an input it writes in place); or None where the
    outputs cannot be known without running it (sizes that depend on values)."""
    real = [t for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
    if any(t.device.type != "cpu" for t in real):
        return None
    shapes = None
    if func.namespace in _DYNEMB_LIBRARIES:
        shapes = _OUTPUTS.get(func.name().split("::")[1].split(".")[0])
    if shapes is not None:
        outs = [torch.empty(shape, dtype=dtype) for shape, dtype in shapes(args)]
        returns = len(func._schema.returns)  # noqa: SLF001 - OpOverload's schema
        if returns == 0:
            return None, []
        result = outs[0] if returns == 1 else tuple(outs)
        return result, outs
    metas: dict[int, torch.Tensor] = {}

    def to_meta(x):
        if isinstance(x, torch.Tensor):
            meta = torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device="meta")
            metas[id(meta)] = x
            return meta
        if isinstance(x, torch.device):
            return torch.device("meta")
        return x

    margs, mkwargs = pytree.tree_map(to_meta, (args, kwargs))
    try:
        mresult = func(*margs, **mkwargs)
    except Exception:  # no meta kernel, or sizes that depend on values
        return None
    fresh: list = []

    def to_real(x):
        if x is None:
            return None
        if not isinstance(x, torch.Tensor):
            raise _NeedsValues
        if id(x) in metas:  # an input it returns (written in place)
            fresh.append(None)
            return metas[id(x)]
        out = torch.empty_strided(x.shape, x.stride(), dtype=x.dtype)
        fresh.append(out)
        return out

    try:
        result = pytree.tree_map(to_real, mresult)
    except _NeedsValues:
        return None
    # An op that resized an input it writes (an ``out=``) needs that size now.
    for meta_leaf in pytree.tree_leaves((margs, mkwargs)):
        if isinstance(meta_leaf, torch.Tensor) and metas[id(meta_leaf)].shape != meta_leaf.shape:
            return None
    return result, fresh


class _NeedsValues(Exception):
    """An op returns a host value (a number, a bool): it reads the device."""


def _leaves(result) -> list:
    return [x for x in pytree.tree_leaves(result) if isinstance(x, torch.Tensor)]


@contextlib.contextmanager
def emulated_streams(seed: int | None = None) -> Iterator[StreamModel]:
    """Activates a StreamModel for the calling thread's work on the emulated executor;
    leaving the block runs every queue (``synchronize``).

    Args:
        seed: see StreamModel.

    Raises:
        RuntimeError: the executor is not ``cuda-emulated`` (the CPU executor has no
            streams), or a model is active already.
    """
    if _ops.executor() != "cuda-emulated":
        raise RuntimeError(
            f"emulated_streams needs DYNEMB_EXECUTOR=cuda-emulated, the executor is "
            f"{_ops.executor()!r} (the CPU executor has no streams)"
        )
    model = StreamModel(seed)
    previous = streams.set_host_model(model)
    if previous is not None:
        streams.set_host_model(previous)
        raise RuntimeError("emulated_streams: a stream model is active already")
    try:
        with model:
            try:
                yield model
            finally:
                model.synchronize()
    finally:
        streams.set_host_model(None)


__all__ = ["EmulatedEvent", "EmulatedStream", "StreamModel", "emulated_streams"]
