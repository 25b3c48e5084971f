"""``BatchStats``: the accounting of one batch op of a table."""

import dataclasses

import torch


@dataclasses.dataclass(frozen=True)
class BatchStats:
    """Accounting of one batch op: ``inserted + evicted + failed`` = distinct new keys.

    Attributes:
        hits: occurrences of keys that were already stored (a key repeated in the
            batch counts as a hit after its first occurrence).
        inserted: new keys stored in a free slot.
        evicted: new keys stored in place of an evicted resident.
        failed: new keys that could not be stored (reported, never silent).
        failed_keys: (failed,) int64, those keys.
    """

    hits: int
    inserted: int
    evicted: int
    failed: int
    failed_keys: torch.Tensor


__all__ = ["BatchStats"]
