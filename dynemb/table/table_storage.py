"""The buffers of one scored hash table (layout: csrc/core/table_ref.h).

``TableStorage`` owns the seven tensors that the ops receive as ``table``; it knows
sizes and memory, nothing about keys. Growth allocates a second storage, rehashes
into it, then drops the first: at most old + new are alive at once.
"""

import dataclasses
import functools

import torch

from dynemb import _ops

_HUGE_PAGE_MIN_BYTES = 4 << 20


def _allocate(shape, dtype, device) -> torch.Tensor:
    """An uninitialised buffer; large host buffers get huge pages before first touch."""
    t = torch.empty(shape, dtype=dtype, device=device)
    if t.numel() * t.element_size() >= _HUGE_PAGE_MIN_BYTES:
        _ops.advise_huge_pages(t)
    return t


@dataclasses.dataclass(frozen=True)
class TableLayout:
    """Geometry shared by every storage of one table.

    Args:
        row_width: dim + extra columns of each value row.
        bucket_capacity: slots per bucket, a multiple of 16.
        value_dtype: float32, float16 or bfloat16.
        keeps_scores: one uint64 score per slot (every strategy but NO_EVICTION).
        keeps_timestamps: a last-access time per slot (the (TIMESTAMP, LFU) compound).
        device: where the buffers live.
    """

    row_width: int
    bucket_capacity: int
    value_dtype: torch.dtype
    keeps_scores: bool
    keeps_timestamps: bool
    device: torch.device

    def bytes_per_slot(self) -> int:
        return (
            1  # digest
            + 8  # key
            + 8 * self.keeps_scores
            + 8 * self.keeps_timestamps
            + self.row_width * torch.empty((), dtype=self.value_dtype).element_size()
        )


class TableStorage:
    """Owns the buffers of a table with ``num_buckets`` buckets of ``layout.bucket_capacity`` slots."""

    def __init__(self, layout: TableLayout, num_buckets: int) -> None:
        self.layout = layout
        self.num_buckets = num_buckets
        slots = num_buckets * layout.bucket_capacity
        new = functools.partial(_allocate, device=layout.device)
        self.digests = new((num_buckets, layout.bucket_capacity), torch.uint8).zero_()
        # Keys and rows are written once here so that every page is faulted in now,
        # not on a key's first insert in the middle of a training step (a fault on a
        # huge-page region may compact memory: milliseconds, and very uneven).
        self.keys = new((slots,), torch.int64).zero_()
        self.scores = new((slots if layout.keeps_scores else 0,), torch.int64).zero_()
        self.timestamps = new((slots if layout.keeps_timestamps else 0,), torch.int64).zero_()
        self.values = new((slots, layout.row_width), layout.value_dtype).zero_()
        self.locks = new((num_buckets,), torch.int32).zero_()
        self.overflow = new((num_buckets,), torch.uint8).zero_()

    @property
    def num_slots(self) -> int:
        return self.num_buckets * self.layout.bucket_capacity

    def tensors(self) -> list[torch.Tensor]:
        """The op argument ``table`` (order fixed by csrc/torch/tensor_checks.h)."""
        return [
            self.digests,
            self.keys,
            self.scores,
            self.timestamps,
            self.values,
            self.locks,
            self.overflow,
        ]

    def occupied(self, begin: int, end: int) -> torch.Tensor:
        """Slots in [begin, end) holding a key: (m,) int64, ascending."""
        flat = self.digests.view(-1)[begin:end]
        return torch.nonzero(flat, as_tuple=True)[0] + begin

    def clear(self) -> None:
        self.digests.zero_()
        self.overflow.zero_()
        self.scores.zero_()
        self.timestamps.zero_()

    def memory_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors())
