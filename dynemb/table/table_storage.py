"""The buffers of one scored hash table (layout: csrc/core/table_ref.h).

``TableStorage`` owns the nine tensors that the ops receive as ``table``; it knows
sizes, tiers and memory, nothing about keys. Growth allocates a second storage,
rehashes into it, then drops the first: at most old + new are alive at once, and in
host memory the old rows go as they move (growth.py, ``_rehash_in_chunks``).

Tiers: the value rows of slots ``[0, fast_slots)`` live in ``values`` (the fast
tier: on a GPU, device memory) and the rest in ``slow_values`` (host memory, or a
file mapping for a spilled table, see spill_files.py). A table in one tier has an
empty ``slow_values``. Which memory holds each buffer is ``placement.py``'s rule.
"""

import ctypes
import dataclasses
import mmap
import operator

import torch

from dynemb import _ops
from dynemb.table.host_memory import PageLock
from dynemb.table.placement import BUFFERS, Memory, table_placement
from dynemb.table.spill_files import SpillDirectory

_TABLE_TENSORS = operator.attrgetter(*_ops.TABLE_TENSORS)

_HUGE_PAGE_MIN_BYTES = 4 << 20
_PAGE = mmap.PAGESIZE
_MADV_DONTNEED = 4  # Linux: the pages go back to the system; a later touch reads zeros
_LIBC = ctypes.CDLL(None, use_errno=True)  # madvise: growth.py uses it on Linux only


def trim_host_heap() -> None:
    """Gives the C heap's free pages back to the system (glibc's malloc_trim)."""
    trim = getattr(_LIBC, "malloc_trim", None)
    if trim is not None:
        trim(0)


def allocate(shape, dtype, device) -> torch.Tensor:
    """An uninitialised buffer; large host buffers get huge pages before first touch."""
    t = torch.empty(shape, dtype=dtype, device=device)
    if t.device.type == "cpu" and t.numel() * t.element_size() >= _HUGE_PAGE_MIN_BYTES:
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
            + 4 * self.keeps_scores  # pin
            + self.row_bytes()
        )


class TableStorage:
    """Owns the buffers of a table with ``num_buckets`` buckets of ``layout.bucket_capacity`` slots.

    The buffers are attributes named as in ``placement.BUFFERS`` (digests, keys,
    scores, timestamps, values, locks, overflow, slow_values, pins).

    Args:
        layout: the table's geometry.
        num_buckets: bucket count of this storage.
        spill: when given, the buffers ``placement.table_placement`` puts in files are
            mappings in generation ``generation`` of that directory; the others are
            written there by ``sync``.
        generation: the spill generation (growth makes a new one).
        reopen: map the existing files of that generation instead of new zero-filled
            ones.
        lazy_values: leave the fast tier's rows (``values``) unwritten, their pages not
            faulted in (growth in chunks writes them as it goes: ``fill_rows``); host
            memory only.

    Raises:
        ValueError: with ``reopen``, a file whose size is not the one this storage
            expects (SpillDirectory.reopen_buffer); no file changes.
    """

    def __init__(
        self,
        layout: TableLayout,
        num_buckets: int,
        spill: SpillDirectory | None = None,
        generation: int = 0,
        reopen: bool = False,
        lazy_values: bool = False,
    ) -> None:
        self.layout = layout
        self.num_buckets = num_buckets
        self.spill = spill
        self.generation = generation
        slots = num_buckets * layout.bucket_capacity
        self.fast_slots = layout.fast_slots(slots)
        self.placement = table_placement(layout.device, spilled=spill is not None)
        self._mapped = []
        self._page_locks = []
        width, vdtype = layout.row_width, layout.value_dtype
        shapes = {
            "digests": ((num_buckets, layout.bucket_capacity), torch.uint8),
            "keys": ((slots,), torch.int64),
            "scores": ((slots if layout.keeps_scores else 0,), torch.int64),
            "timestamps": ((slots if layout.keeps_timestamps else 0,), torch.int64),
            "values": ((self.fast_slots, width), vdtype),
            "locks": ((num_buckets,), torch.int32),
            "overflow": ((num_buckets,), torch.uint8),
            "slow_values": ((slots - self.fast_slots, width), vdtype),
            # A slot's pin (csrc/core/table_ops.h "Pins"): evicting strategies only.
            "pins": ((slots if layout.keeps_scores else 0,), torch.int32),
        }
        self._lazy = ("values",) if lazy_values else ()
        for name in BUFFERS:
            shape, dtype = shapes[name]
            setattr(self, name, self._buffer(name, shape, dtype, reopen))
        if spill is not None and reopen:
            for name in self.placement.resident_spill_buffers():
                buffer = getattr(self, name)
                file = _spill_file_name(name)
                saved = spill.reopen_buffer(generation, file, buffer.shape, buffer.dtype)
                buffer.copy_(saved.tensor)

    def _buffer(self, name: str, shape: tuple, dtype: torch.dtype, reopen: bool) -> torch.Tensor:
        memory = self.placement.memory[name]
        if memory is Memory.FILE:
            map_file = self.spill.reopen_buffer if reopen else self.spill.create_buffer
            mapped = map_file(self.generation, name, shape, dtype)
            self._mapped.append(mapped)
            buffer = mapped.tensor
        else:
            device = self.layout.device if memory is Memory.DEVICE else torch.device("cpu")
            # Written once here so that every page is faulted in now, not on a key's
            # first insert in the middle of a training step (a fault on a huge-page
            # region may compact memory: milliseconds, and very uneven).
            buffer = allocate(shape, dtype, device)
            if name not in self._lazy:
                buffer.zero_()
        if memory is not Memory.DEVICE and self.placement.registers_host_memory:
            self._page_locks.append(PageLock(buffer))
        return buffer

    @property
    def num_slots(self) -> int:
        return self.num_buckets * self.layout.bucket_capacity

    def tensors(self) -> list[torch.Tensor]:
        """The op argument ``table``: the buffers ``_ops.TABLE_TENSORS`` names, in its
        order (csrc/torch/op_lists.h)."""
        return list(_TABLE_TENSORS(self))

    def rows(
        self, slots: torch.Tensor, width: int, out: torch.Tensor | None = None
    ) -> torch.Tensor:
        """The first ``width`` columns of the rows of ``slots`` ((n,) int64, all valid),
        into ``out`` ((n, width), this table's dtype and device) when given: a caller
        that gathers often passes a buffer it reuses (a fresh multi-MB output costs
        more in page faults than the gather)."""

        def gather(buffer, at, into=None):  # index_select copies whole rows, several x faster
            if width != buffer.shape[1]:
                rows = buffer[at, :width]
                return rows if into is None else into.copy_(rows)
            if into is None:
                # Into huge pages: faulting in a fresh multi-MB output 4 KiB at a time
                # took half of a delta capture's gather (88 -> 44 ms per 400k rows).
                into = allocate((at.numel(), width), buffer.dtype, buffer.device)
            return torch.index_select(buffer, 0, at, out=into)

        if self.slow_values.numel() == 0:
            return gather(self.values, slots, out)
        if out is None:
            out = torch.empty(
                (slots.numel(), width), dtype=self.layout.value_dtype, device=self.layout.device
            )
        fast = slots < self.fast_slots
        out[fast] = gather(self.values, slots[fast])
        slow = ~fast
        # On a GPU the slow tier is host memory: gather there, copy the rows over.
        at = (slots[slow] - self.fast_slots).to(self.slow_values.device)
        out[slow] = gather(self.slow_values, at).to(out.device)
        return out

    def write_rows(self, slots: torch.Tensor, rows: torch.Tensor) -> None:
        """Writes ``rows`` ((n, w), this table's dtype and device) into the first ``w``
        columns of the rows of ``slots`` ((n,) int64, distinct, all valid), in either tier."""
        width = rows.shape[1]
        if self.slow_values.numel() == 0:
            self.values[:, :width].index_copy_(0, slots, rows)
            return
        fast = slots < self.fast_slots
        self.values[:, :width].index_copy_(0, slots[fast], rows[fast])
        slow = ~fast
        at = (slots[slow] - self.fast_slots).to(self.slow_values.device)
        self.slow_values[:, :width].index_copy_(0, at, rows[slow].to(self.slow_values.device))

    def occupied(self, begin: int, end: int) -> torch.Tensor:
        """Slots in [begin, end) holding a key: (m,) int64, ascending."""
        flat = self.digests.view(-1)[begin:end]
        return torch.nonzero(flat, as_tuple=True)[0] + begin

    def clear(self) -> None:
        self.digests.zero_()
        self.overflow.zero_()
        self.scores.zero_()
        self.timestamps.zero_()
        self.pins.zero_()

    def bucket_range(self, begin: int, end: int) -> list[torch.Tensor]:
        """The op argument ``table`` of buckets ``[begin, end)`` alone (views): a rehash
        source of that range. Needs every row in the fast tier."""
        c = self.layout.bucket_capacity

        def slots(t):
            return t[begin * c : end * c] if t.numel() else t

        per_bucket = {"digests", "locks", "overflow"}
        views = {
            name: getattr(self, name)[begin:end] if name in per_bucket
            else self.slow_values if name == "slow_values" else slots(getattr(self, name))
            for name in _ops.TABLE_TENSORS
        }  # fmt: skip
        return [views[name] for name in _ops.TABLE_TENSORS]

    def fill_rows(self, begin: int, end: int) -> None:
        """Writes zeros to the fast-tier rows ``[begin, end)``: faults in the pages of a
        ``lazy_values`` storage before its rows are written."""
        self.values[begin:end].zero_()

    def release_rows(self, end: int) -> None:
        """Gives the pages under the fast-tier rows ``[0, end)`` back to the system
        (host memory only; the page that row ``end`` starts in is kept): the rows then
        read as zeros. Growth in chunks frees the rows it has moved; the storage must
        not be read there again before they are written. A page freed already costs a
        page-table walk, nothing more."""
        row = self.layout.row_bytes()
        base = self.values.data_ptr()
        lo = -(-base // _PAGE) * _PAGE  # the first page may hold another allocation
        hi = (base + end * row) // _PAGE * _PAGE
        if hi > lo and _LIBC.madvise(ctypes.c_void_p(lo), ctypes.c_size_t(hi - lo), _MADV_DONTNEED):
            raise OSError(ctypes.get_errno(), "madvise(MADV_DONTNEED) of a table's moved rows")

    def memory_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors())

    def tier_bytes(self) -> tuple[int, int]:
        """Bytes of value rows in the fast and in the slow tier."""
        row = self.layout.row_bytes()
        return self.fast_slots * row, (self.num_slots - self.fast_slots) * row

    def sync(self) -> None:
        """Spilled tables: writes the buffers kept in memory (the fast-tier rows; on a
        GPU also the key metadata) beside the mapped ones and syncs every mapping, so
        the spill directory holds the whole table."""
        if self.spill is None:
            return
        for name in self.placement.resident_spill_buffers():
            buffer = getattr(self, name)
            if buffer.numel():
                file = _spill_file_name(name)
                mapped = self.spill.create_buffer(self.generation, file, buffer.shape, buffer.dtype)
                mapped.tensor.copy_(buffer)
                mapped.sync()
        for mapped in self._mapped:
            mapped.sync()


def _spill_file_name(buffer: str) -> str:
    return "fast_values" if buffer == "values" else buffer
