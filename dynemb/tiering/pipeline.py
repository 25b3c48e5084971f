"""``PrefetchPipeline``: overlaps the prefetch of batch t+1 with the compute of batch t.

On a CPU the prefetch runs in one background thread: the table ops release the
GIL, so the slow-tier reads and cache inserts of the next batch proceed while the
current batch's forward / backward run. Keys prefetched for a batch stay pinned
in the cache until that batch's backward (dynemb.tiering.cached_table).

Overlap needs a free core. When the training step's threads already use every
core the process may run on, a background prefetch only competes with them (on 2
cores, W-train with a 25% cache ran at 37k samples/s overlapped against 53k
without prefetch), so the pipeline then prefetches each batch in the main
thread right before its step (``overlap=None`` decides so; pass True or False to
choose).

A sharded model (DistributedModelParallel) prefetches through TorchRec's own hook,
``ShardedModule.prefetch``: ``distribute_for_prefetch`` runs a sharded collection's
input dist on the future batch in the main thread (a collective, so every rank
issues it in the same order), and ``prefetch_distributed`` hands each rank's keys to
its dynamic kernels, in the background.
"""

import dataclasses
import os
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import torch

from dynemb import _ops

Batch = TypeVar("Batch")


class PrefetchPipeline:
    """Runs ``step`` over batches, prefetching each next batch in the background.

    Args:
        batches: the training batches, in order.
        step: trains on one batch (forward, backward, optimizer step); its result is
            yielded.
        prefetch: brings one batch's keys into the caches, e.g.
            ``lambda b: tables.prefetch(b.indices, b.offsets)`` for a
            BatchedDynamicEmbeddingTables. Called once per batch, in batch order,
            before that batch's ``step``, in the background thread.
        distribute: optional; runs in the main thread on each upcoming batch before
            the previous step, and ``prefetch`` gets its result instead of the batch
            (e.g. the input dist of a sharded model: ``distribute_for_prefetch``).
        overlap: prefetch batch t+1 in a background thread during step t (True), or
            each batch in the main thread right before its step (False); None: True
            when the process may run on more cores than ``torch.get_num_threads()``.

    Example::

        >>> pipe = PrefetchPipeline(batches, step=lambda b: tables(*b).sum().backward(),
        ...                         prefetch=lambda b: tables.prefetch(*b))
        >>> for _ in pipe:
        ...     pass
    """

    def __init__(
        self,
        batches: Iterable[Batch],
        step: Callable[[Batch], Any],
        prefetch: Callable[[Any], None],
        distribute: Callable[[Batch], Any] | None = None,
        overlap: bool | None = None,
    ) -> None:
        self.batches = batches
        self.step = step
        self.prefetch = prefetch
        self.distribute = distribute if distribute is not None else (lambda batch: batch)
        self.overlap = _has_spare_core() if overlap is None else overlap

    def __iter__(self) -> Iterator[Any]:
        if not self.overlap:
            for batch in self.batches:
                self.prefetch(self.distribute(batch))
                yield self.step(batch)
            return
        it = iter(self.batches)
        current = next(it, _END)
        if current is _END:
            return
        self.prefetch(self.distribute(current))
        with ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="dynemb-prefetch", initializer=_one_thread
        ) as pool:
            while current is not _END:
                upcoming = next(it, _END)
                pending = None
                if upcoming is not _END:
                    pending = pool.submit(self.prefetch, self.distribute(upcoming))
                try:
                    result = self.step(current)
                finally:
                    if pending is not None:
                        pending.result()  # re-raises a prefetch error
                yield result
                current = upcoming

    def run(self) -> list:
        """Runs every batch; returns the step results."""
        return list(self)


_END = object()


def _has_spare_core() -> bool:
    """True when the process may run on more cores than the training step's threads."""
    return len(os.sched_getaffinity(0)) > torch.get_num_threads()


def _one_thread() -> None:
    """The prefetch thread's ops run on one thread: a second team as large as the
    training step's would oversubscribe the cores (see csrc/torch/threads_cpu.cpp)."""
    _ops.set_thread_limit(1)


@dataclasses.dataclass
class DistributedInput:
    """A sharded collection's input dist of a future batch (see distribute_for_prefetch)."""

    module: Any  # a TorchRec ShardedModule (e.g. ShardedDynamicEmbeddingBagCollection)
    ctx: Any
    dist_input: Any


def distribute_for_prefetch(module, features) -> DistributedInput:
    """Runs ``module``'s input dist on a future batch's features.

    A collective over the model's process group: call it in the main thread, for the
    same batches in the same order on every rank (PrefetchPipeline's ``distribute``).

    Args:
        module: a sharded collection inside a DistributedModelParallel model.
        features: the KeyedJaggedTensor that collection's forward will get.
    """
    ctx = module.create_context()
    return DistributedInput(module, ctx, module.input_dist(ctx, features).wait().wait())


def prefetch_distributed(inputs: Iterable[DistributedInput]) -> None:
    """TorchRec's ``ShardedModule.prefetch`` on each input: every dynamic kernel of this
    rank prefetches its keys (caching mode); local work, safe in a background thread."""
    for x in inputs:
        x.module.prefetch(x.dist_input, None, x.ctx)


__all__ = [
    "DistributedInput",
    "PrefetchPipeline",
    "distribute_for_prefetch",
    "prefetch_distributed",
]
