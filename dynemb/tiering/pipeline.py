"""``PrefetchPipeline``: overlaps the prefetch of batch t+1 with the compute of batch t.

On a CPU the prefetch runs in one background thread: the table ops release the
GIL, so the slow-tier reads and cache inserts of the next batch proceed while the
current batch's forward / backward run. Keys prefetched for a batch stay pinned
in the cache until that batch's backward (dynemb.tiering.cached_table).

A sharded model (DistributedModelParallel) prefetches through TorchRec's own hook,
``ShardedModule.prefetch``: ``distribute_for_prefetch`` runs a sharded collection's
input dist on the future batch in the main thread (a collective, so every rank
issues it in the same order), and ``prefetch_distributed`` hands each rank's keys to
its dynamic kernels, in the background.
"""

import dataclasses
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

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
    ) -> None:
        self.batches = batches
        self.step = step
        self.prefetch = prefetch
        self.distribute = distribute if distribute is not None else (lambda batch: batch)

    def __iter__(self) -> Iterator[Any]:
        it = iter(self.batches)
        current = next(it, _END)
        if current is _END:
            return
        self.prefetch(self.distribute(current))
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="dynemb-prefetch") as pool:
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
