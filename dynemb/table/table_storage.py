"""The buffers of one scored hash table (layout: csrc/core/table_ref.h).

``TableStorage`` owns the seven tensors that the ops receive as ``table``; it knows
sizes and memory, nothing about keys. Growth allocates a second storage, rehashes
into it, then drops the first: at most old + new are alive at once.
"""

import dataclasses

import torch


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
        dev = layout.device
        self.digests = torch.zeros(
            (num_buckets, layout.bucket_capacity), dtype=torch.uint8, device=dev
        )
        self.keys = torch.empty(slots, dtype=torch.int64, device=dev)
        self.scores = torch.zeros(
            slots if layout.keeps_scores else 0, dtype=torch.int64, device=dev
        )
        self.timestamps = torch.zeros(
            slots if layout.keeps_timestamps else 0, dtype=torch.int64, device=dev
        )
        self.values = torch.empty((slots, layout.row_width), dtype=layout.value_dtype, device=dev)
        self.locks = torch.zeros(num_buckets, dtype=torch.int32, device=dev)
        self.overflow = torch.zeros(num_buckets, dtype=torch.uint8, device=dev)

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

    def size(self) -> int:
        return int(torch.count_nonzero(self.digests))

    def clear(self) -> None:
        self.digests.zero_()
        self.overflow.zero_()
        self.scores.zero_()
        self.timestamps.zero_()

    def memory_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors())
