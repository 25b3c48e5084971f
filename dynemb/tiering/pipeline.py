"""``PrefetchPipeline``: overlaps the prefetch of batch t+1 with the compute of batch t.

On a CPU the prefetch runs in one background thread: the table ops release the
GIL, so the slow-tier reads and cache inserts of the next batch proceed while the
current batch's forward / backward run. Keys prefetched for a batch stay pinned
in the cache until that batch's backward (dynemb.tiering.cached_table).
"""

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
            before that batch's ``step``.

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
        prefetch: Callable[[Batch], None],
    ) -> None:
        self.batches = batches
        self.step = step
        self.prefetch = prefetch

    def __iter__(self) -> Iterator[Any]:
        it = iter(self.batches)
        current = next(it, _END)
        if current is _END:
            return
        self.prefetch(current)
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="dynemb-prefetch") as pool:
            while current is not _END:
                upcoming = next(it, _END)
                pending = pool.submit(self.prefetch, upcoming) if upcoming is not _END else None
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

__all__ = ["PrefetchPipeline"]
