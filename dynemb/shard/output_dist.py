"""Output dists that keep TorchRec's semantics where its own fail on gloo.

- Pooled (EBC), uneven per-rank batches: TorchRec's reduce-scatter backward is an
  all_gather of unequal tensors, which gloo refuses. ``RwUnevenPooledEmbeddingDist``
  runs the reduce-scatter-v as an all-to-all of unequal splits (which gloo does),
  with the same gradient division by the world size; even batches keep TorchRec's.
- Table-row-wise pooled (EBC), uneven per-rank batches: the same within the node
  (``TwRwUnevenPooledEmbeddingDist``), then TorchRec's all-to-all across nodes.
- Sequence (EC), a rank with an empty batch: TorchRec's EC output reshapes lengths by
  ``stride() == 0`` and fails. ``EmptyBatchSafeAwaitable`` returns empty jagged tensors
  still attached to the received embeddings, so this rank's backward joins the
  all-to-all that the other ranks wait for.
"""

import torch
import torch.distributed as dist
from torchrec.distributed.comm_ops import get_gradient_division
from torchrec.distributed.sharding.rw_sharding import RwPooledEmbeddingDist
from torchrec.distributed.sharding.twrw_sharding import TwRwPooledEmbeddingDist
from torchrec.distributed.types import Awaitable, LazyAwaitable, NoWait
from torchrec.sparse.jagged_tensor import JaggedTensor


class _ReduceScatterV(torch.autograd.Function):
    """Sums each rank's rows of every rank's partial sums, by all-to-all."""

    @staticmethod
    def forward(ctx, local_embs, splits: list[int], rank: int, pg):
        world_size = len(splits)
        mine = splits[rank]
        received = local_embs.new_empty((mine * world_size, local_embs.shape[1]))
        dist.all_to_all_single(
            received, local_embs.contiguous(), [mine] * world_size, splits, group=pg
        )
        ctx.splits, ctx.rank, ctx.pg = splits, rank, pg
        return received.view(world_size, mine, local_embs.shape[1]).sum(0)

    @staticmethod
    def backward(ctx, grad):
        world_size = len(ctx.splits)
        mine = ctx.splits[ctx.rank]
        if get_gradient_division():
            grad = grad / world_size
        grad_input = grad.new_empty((sum(ctx.splits), grad.shape[1]))
        dist.all_to_all_single(
            grad_input,
            grad.contiguous().repeat(world_size, 1),
            ctx.splits,
            [mine] * world_size,
            group=ctx.pg,
        )
        return grad_input, None, None, None


def _uneven_splits(sharding_ctx, codecs) -> list[int] | None:
    """The per-rank batch sizes when they differ (and no variable batch per feature or
    codec asks for TorchRec's own path), else None."""
    splits = None if sharding_ctx is None else sharding_ctx.batch_size_per_rank
    if (
        not splits
        or sharding_ctx.variable_batch_per_feature
        or len(set(splits)) == 1
        or codecs is not None
    ):
        return None
    return list(splits)


class RwUnevenPooledEmbeddingDist(RwPooledEmbeddingDist):
    """TorchRec's row-wise pooled dist; uneven per-rank batches go by all-to-all."""

    def forward(self, local_embs: torch.Tensor, sharding_ctx=None) -> Awaitable[torch.Tensor]:
        splits = _uneven_splits(sharding_ctx, self._codecs)
        if splits is None:
            return super().forward(local_embs, sharding_ctx)
        return NoWait(_ReduceScatterV.apply(local_embs, splits, self._pg.rank(), self._pg))


class TwRwUnevenPooledEmbeddingDist(TwRwPooledEmbeddingDist):
    """TorchRec's table-row-wise pooled dist; with uneven per-rank batches the
    reduce-scatter inside the node goes by all-to-all (as ``RwUnevenPooledEmbeddingDist``),
    then TorchRec's all-to-all across nodes."""

    def forward(self, local_embs: torch.Tensor, sharding_ctx=None) -> Awaitable[torch.Tensor]:
        splits = _uneven_splits(sharding_ctx, self._intra_codecs)
        if splits is None:
            return super().forward(local_embs, sharding_ctx)
        if self._cross_dist is None:
            self._create_output_dist_modules(sharding_ctx)
        intra = self._intra_pg
        # TorchRec's order of the samples a rank holds: local rank by local rank, node by node.
        per_rank, per_local_rank = self._preprocess_batch_size_per_rank(
            intra.size(), self._cross_pg.size(), splits
        )
        summed = _ReduceScatterV.apply(local_embs, per_local_rank, intra.rank(), intra)
        return self._cross_dist(summed, batch_size_per_rank=per_rank[intra.rank()])


class EmptyBatchSafeAwaitable(LazyAwaitable[dict[str, JaggedTensor]]):
    """TorchRec's EC output awaitable, except on a rank whose batch is empty."""

    def __init__(self, inner) -> None:
        super().__init__()
        self._inner = inner

    def _wait_impl(self) -> dict[str, JaggedTensor]:
        inner = self._inner
        # TorchRec's EmbeddingCollectionAwaitable exposes its parts only as privates.
        features = inner._features_per_sharding  # noqa: SLF001 - no public accessor in TorchRec
        if any(f.stride() != 0 for f in features):
            return inner.wait()
        out = {}
        awaitables = inner._awaitables_per_sharding  # noqa: SLF001 - as above
        names_per_sharding = inner._embedding_names_per_sharding  # noqa: SLF001 - as above
        for w, names in zip(awaitables, names_per_sharding):
            embeddings = w.wait()  # zero rows, but on the autograd graph
            for name in names:
                out[name] = JaggedTensor(
                    values=embeddings[:0],
                    lengths=torch.zeros(0, dtype=torch.int32, device=embeddings.device),
                )
        return out
