"""The buffers of one scored hash table (layout: csrc/core/table_ref.h).

``TableStorage`` owns the eight tensors that the ops receive as ``table``; it knows
sizes, tiers and memory, nothing about keys. Growth allocates a second storage,
rehashes into it, then drops the first: at most old + new are alive at once.

Tiers: the value rows of slots ``[0, fast_slots)`` live in ``values`` (the fast
tier: on a GPU, device memory) and the rest in ``slow_values`` (host memory, or a
file mapping for a spilled table, see spill_files.py). A table in one tier has an
empty ``slow_values``.
"""

import dataclasses
import os

import torch

from dynemb import _ops
from dynemb.table.spill_files import SpillDirectory

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
        fast_rows: most rows the fast tier holds (``None``: every row); the other
            rows go to the slow tier.
    """

    row_width: int
    bucket_capacity: int
    value_dtype: torch.dtype
    keeps_scores: bool
    keeps_timestamps: bool
    device: torch.device
    fast_rows: int | None = None

    def row_bytes(self) -> int:
        return self.row_width * torch.empty((), dtype=self.value_dtype).element_size()

    def fast_slots(self, num_slots: int) -> int:
        return num_slots if self.fast_rows is None else min(num_slots, self.fast_rows)

    def bytes_per_slot(self) -> int:
        return (
            1  # digest
            + 8  # key
            + 8 * self.keeps_scores
            + 8 * self.keeps_timestamps
            + self.row_bytes()
        )


class TableStorage:
    """Owns the buffers of a table with ``num_buckets`` buckets of ``layout.bucket_capacity`` slots.

    Args:
        layout: the table's geometry.
        num_buckets: bucket count of this storage.
        spill: when given, every slot buffer but the fast-tier rows and the locks is a
            file mapping in generation ``generation`` of that directory.
        generation: the spill generation (growth makes a new one).
        reopen: map the existing files of that generation (they must have the sizes
            this storage expects) instead of starting empty.
    """

    def __init__(
        self,
        layout: TableLayout,
        num_buckets: int,
        spill: SpillDirectory | None = None,
        generation: int = 0,
        reopen: bool = False,
    ) -> None:
        self.layout = layout
        self.num_buckets = num_buckets
        self.spill = spill
        self.generation = generation
        slots = num_buckets * layout.bucket_capacity
        self.fast_slots = layout.fast_slots(slots)
        self._mapped = []

        def anonymous(shape, dtype):
            # Written once here so that every page is faulted in now, not on a key's
            # first insert in the middle of a training step (a fault on a huge-page
            # region may compact memory: milliseconds, and very uneven).
            return _allocate(shape, dtype, layout.device).zero_()

        def slot_buffer(name, shape, dtype):
            if spill is None:
                return anonymous(shape, dtype)
            if reopen:
                _check_spill_file(spill, generation, name, shape, dtype)
            mapped = spill.buffer(generation, name, shape, dtype)
            self._mapped.append(mapped)
            return mapped.tensor

        width, vdtype = layout.row_width, layout.value_dtype
        self.digests = slot_buffer("digests", (num_buckets, layout.bucket_capacity), torch.uint8)
        self.keys = slot_buffer("keys", (slots,), torch.int64)
        self.scores = slot_buffer("scores", (slots if layout.keeps_scores else 0,), torch.int64)
        self.timestamps = slot_buffer(
            "timestamps", (slots if layout.keeps_timestamps else 0,), torch.int64
        )
        self.values = anonymous((self.fast_slots, width), vdtype)
        self.slow_values = slot_buffer("slow_values", (slots - self.fast_slots, width), vdtype)
        self.locks = anonymous((num_buckets,), torch.int32)
        self.overflow = slot_buffer("overflow", (num_buckets,), torch.uint8)
        if spill is not None and reopen and self.fast_slots:
            name = "fast_values"
            _check_spill_file(spill, generation, name, (self.fast_slots, width), vdtype)
            self.values.copy_(spill.buffer(generation, name, self.values.shape, vdtype).tensor)

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
            self.slow_values,
        ]

    def rows(self, slots: torch.Tensor, width: int) -> torch.Tensor:
        """The first ``width`` columns of the rows of ``slots`` ((n,) int64, all valid)."""

        def gather(buffer, at):  # index_select copies whole rows, several x faster
            return buffer.index_select(0, at) if width == buffer.shape[1] else buffer[at, :width]

        if self.slow_values.numel() == 0:
            return gather(self.values, slots)
        out = torch.empty(
            (slots.numel(), width), dtype=self.layout.value_dtype, device=self.layout.device
        )
        fast = slots < self.fast_slots
        out[fast] = gather(self.values, slots[fast])
        slow = ~fast
        out[slow] = gather(self.slow_values, slots[slow] - self.fast_slots)
        return out

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

    def tier_bytes(self) -> tuple[int, int]:
        """Bytes of value rows in the fast and in the slow tier."""
        row = self.layout.row_bytes()
        return self.fast_slots * row, (self.num_slots - self.fast_slots) * row

    def sync(self) -> None:
        """Spilled tables: writes the fast-tier rows beside the other buffers and
        syncs every file mapping, so the spill directory holds the whole table."""
        if self.spill is None:
            return
        if self.fast_slots:
            shape, dtype = self.values.shape, self.layout.value_dtype
            mapped = self.spill.buffer(self.generation, "fast_values", shape, dtype)
            mapped.tensor.copy_(self.values)
            mapped.sync()
        for mapped in self._mapped:
            mapped.sync()


def _check_spill_file(spill, generation, name, shape, dtype) -> None:
    numel = 1
    for s in shape:
        numel *= s
    want = numel * torch.empty((), dtype=dtype).element_size()
    path = os.path.join(spill.generation_dir(generation), name)
    have = os.path.getsize(path) if os.path.exists(path) else None
    if want and have != want:
        raise ValueError(
            f"spill directory {spill.path!r}: {path} has {have} bytes, the table needs {want}"
        )
