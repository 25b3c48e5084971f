"""Per-rank batches of click rows as TorchRec inputs (KeyedJaggedTensor + dense + labels)."""

from collections.abc import Iterator

import numpy as np
import torch
from torchrec.datasets.utils import Batch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from dynemb.datasets.click_rows import ClickRows

__all__ = ["ClickBatches", "num_batches", "spread_ids"]

SPREAD = 0x9E3779B97F4A7C15  # 2^64 / golden ratio, odd: multiplication is a bijection
KEY_MASK = 0x7FFFFFFFFFFFFFFF


def spread_ids(ids: torch.Tensor | np.ndarray) -> torch.Tensor:
    """Spreads ids over the 63-bit key space: ``(id * 0x9E3779B97F4A7C15) & (2^63 - 1)``.

    The same mapping as the W-train benchmark; wrapping 64-bit arithmetic. Distinct
    ids in ``[0, 2^63)`` stay distinct.

    Args:
        ids: ``(n,)`` integer ids (non-negative).

    Returns:
        ``(n,)`` int64 keys in ``[0, 2^63)``.
    """
    ids = ids.numpy() if isinstance(ids, torch.Tensor) else ids
    keys = ids.astype(np.uint64) * np.uint64(SPREAD) & np.uint64(KEY_MASK)
    return torch.from_numpy(keys.astype(np.int64))


def num_batches(num_rows: int, batch_size: int, world_size: int, drop_last: bool) -> int:
    """Steps over ``num_rows`` rows in global batches of ``batch_size * world_size``.

    A last, partial global batch counts unless ``drop_last`` or it has fewer rows than
    ranks (it is then split into ``rest // world_size`` rows per rank).
    """
    full, rest = divmod(num_rows, batch_size * world_size)
    return full + int(not drop_last and rest >= world_size)


class ClickBatches:
    """Rank ``rank``'s batches of ``rows`` (see ``SyntheticClicks.batches``), with ``len``.

    Args:
        rows: the split.
        feature_names: the KJT keys, one per feature of ``rows``.
        batch_size, rank, world_size, drop_last: as in ``SyntheticClicks.batches``.
        spread: per feature, whether its ids are given spread (``spread_ids``) or as rows.
    """

    def __init__(
        self,
        rows: ClickRows,
        feature_names: list[str],
        batch_size: int,
        rank: int,
        world_size: int,
        spread: list[bool],
        drop_last: bool,
    ) -> None:
        self.rows, self.feature_names = rows, feature_names
        self.batch_size, self.rank, self.world_size = batch_size, rank, world_size
        self.spread = spread
        self.drop_last = drop_last

    def __len__(self) -> int:
        return num_batches(len(self.rows), self.batch_size, self.world_size, self.drop_last)

    def __iter__(self) -> Iterator[Batch]:
        rows = self.rows
        global_batch = self.batch_size * self.world_size
        for step in range(len(self)):
            start = step * global_batch
            per_rank = min(self.batch_size, (len(rows) - start) // self.world_size)
            begin = start + self.rank * per_rank
            yield self._batch(rows, begin, begin + per_rank)

    def _batch(self, rows: ClickRows, begin: int, end: int) -> Batch:
        values, lengths = [], []
        for ids, offsets, spread in zip(rows.ids, rows.offsets, self.spread, strict=True):
            part = ids[offsets[begin] : offsets[end]]
            values.append(spread_ids(part) if spread else torch.from_numpy(part))
            lengths.append(torch.from_numpy(np.diff(offsets[begin : end + 1]).astype(np.int32)))
        return Batch(
            dense_features=torch.from_numpy(rows.dense[begin:end]),
            sparse_features=KeyedJaggedTensor(
                keys=self.feature_names, values=torch.cat(values), lengths=torch.cat(lengths)
            ),
            labels=torch.from_numpy(rows.labels[begin:end]),
        )
