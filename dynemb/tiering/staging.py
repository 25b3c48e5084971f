"""``Staged``: keys of a training batch that its cache could not take.

When every slot of a key's cache bucket is pinned by batches in flight, the key is
staged: its row (from the slow tier, or initial) goes to a small private table of
the batch, which the embedding kernels read and update like the cache; after the
backward the row goes back to the slow tier (dynemb.tiering.cached_table, Pinning).
"""

import dataclasses
import math

import torch

from dynemb.table.table_storage import TableLayout, TableStorage


@dataclasses.dataclass
class Staged:
    """Keys of one training batch that the cache could not take.

    Attributes:
        keys: (F,) int64. scores: (F,) int64, their scores after this lookup.
        storage: a private table whose slot i holds the row of keys[i].
        unique_slots: (U,) int64, for each distinct key of the batch its slot in
            ``storage``, -1 for the keys the cache holds.
    """

    keys: torch.Tensor
    scores: torch.Tensor
    storage: TableStorage
    unique_slots: torch.Tensor

    @classmethod
    def of(cls, keys, pos, rows, scores) -> "Staged":
        """The staged keys ``keys[pos]`` of a batch's distinct ``keys``, with their rows
        ((F, row_width), the value dtype) and scores."""
        n = pos.numel()
        layout = TableLayout(
            row_width=rows.shape[1], bucket_capacity=16, value_dtype=rows.dtype,
            keeps_scores=True, keeps_timestamps=False, device=rows.device,
        )  # fmt: skip
        storage = TableStorage(layout, max(1, math.ceil(n / 16)))
        storage.values[:n] = rows
        unique_slots = torch.full_like(keys, -1)
        unique_slots[pos] = torch.arange(n, device=keys.device)
        return cls(keys[pos], scores, storage, unique_slots)


__all__ = ["Staged"]
