"""``ScoredHashTable``: a bucketed hash table from any int64 key to a value row and a score.

The algorithm (probe, digest match, victim choice, score update) lives in
csrc/core and runs on the table's device through ``dynemb._ops``; this class
validates arguments and owns the table's state (a TableState: buffers, counters,
lock, logs), which it hands to the helpers that implement its ops: growth.py (batch
upserts and growth), spill_persistence.py (the spill directory). Its API's other
parts, over the same state: slot_access.py (the slot-level Table protocol and
snapshots), memory_batches.py (the Table members a cache implements further),
entry_transfer.py (export_batch and restore).
"""

from collections.abc import Sequence

import torch

from dynemb import _ops
from dynemb._host_reads import read_to_host
from dynemb.config.table_options import DynamicEmbInitializerArgs, check_float32
from dynemb.config.types import DynamicEmbScoreStrategy
from dynemb.table import batch_arguments as args
from dynemb.table.batch_stats import BatchStats
from dynemb.table.capacity import bucket_counts
from dynemb.table.entry_transfer import EntryTransfer
from dynemb.table.growth import upsert
from dynemb.table.memory_batches import MemoryBatches
from dynemb.table.placement import canonical_device
from dynemb.table.slot_access import SlotAccess
from dynemb.table.spill_files import SpillDirectory
from dynemb.table.spill_persistence import commit_spill, reopen, spill_meta
from dynemb.table.table_state import TableState
from dynemb.table.table_storage import TableLayout, TableStorage

_VALUE_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


class ScoredHashTable(EntryTransfer, SlotAccess, MemoryBatches):
    """A dynamic embedding table: int64 key -> value row + score, with eviction or growth.

    Every int64 is a legal key (emptiness is kept in a per-slot digest byte, no key
    value is reserved). A key hashes to one bucket of ``bucket_capacity`` slots; when
    the bucket is full, the resident with the smallest score is evicted (ties
    broken by the key's digest, then the key, so results never depend on thread
    count). While the table
    is below ``capacity`` it grows (2x buckets) instead of evicting; under
    NO_EVICTION it never evicts, and once at ``capacity`` keys that do not fit are
    reported as failed. Batch ops de-duplicate: a key repeated in a batch is stored
    once and every occurrence sees the same row.

    Args:
        dim: embedding width (columns initialised by ``initializer``).
        capacity: maximum number of slots (rounded up to the bucket layout).
        init_capacity: initial slots (``None``: ``capacity``); the table doubles up to
            ``capacity`` as keys arrive.
        bucket_capacity: slots per bucket, a positive multiple of 16.
        score_strategy: a DynamicEmbScoreStrategy or ``(TIMESTAMP, LFU | DECAYED_LFU)``.
        score_half_life_steps: DECAYED_LFU's half-life in steps (required by it only).
        value_dtype: storage type of rows: float32, float16 or bfloat16.
        extra_columns: columns stored after the embedding (optimizer state), set to
            ``extra_init`` for new keys.
        initializer: how new rows are initialised; a function of (seed, key).
        seed: initializer seed.
        device: where the table lives (CPU always; CUDA in CUDA builds).
        extra_init: initial value of the extra columns (a float32 number).
        extra_zeros: the first this many extra columns of a new row start at 0 rather
            than ``extra_init`` (FTRL's linear term, before its accumulator).
        fast_rows: hybrid tiers: at most this many value rows live in the fast tier
            (device memory on a GPU), the rest in the slow tier (host memory); a
            slot's index decides its tier (``None``: every row is fast; with a
            ``spill_directory``, ``None`` means 0: every row is in the file).
        spill_directory: keep the slot buffers (keys, scores, slow-tier rows; on a GPU
            the slow-tier rows, the rest written there by ``flush``) in
            memory-mapped files under this directory, so the table may exceed RAM.
            If the directory holds a table flushed before (``flush``), it is reopened
            (its layout must match these arguments); otherwise a new table starts.
        initializer_capacity: the capacity the initializer's default bounds are
            computed for (``None``: ``capacity``); a cache sets its whole table's.
        column_offset: the table holds columns ``[column_offset, column_offset + dim)``
            of wider rows (a column-wise slice): a new row is those columns of the row
            the whole table would give its key. In [0, 2**31 - dim].

    Raises:
        TypeError / ValueError: on a bad argument, naming it and the value.

    Example::

        >>> t = ScoredHashTable(dim=4, capacity=1024)
        >>> keys = torch.tensor([7, -3, 2**63 - 1])
        >>> rows = t.find_or_insert(keys)          # (3, 4), new rows initialised
        >>> values, found = t.find(torch.tensor([7, 8]))
        >>> found
        tensor([ True, False])
    """

    def __init__(
        self,
        dim: int,
        capacity: int,
        init_capacity: int | None = None,
        bucket_capacity: int = 128,
        score_strategy: args.ScoreStrategyArg = DynamicEmbScoreStrategy.TIMESTAMP,
        value_dtype: torch.dtype = torch.float32,
        extra_columns: int = 0,
        initializer: DynamicEmbInitializerArgs | None = None,
        seed: int = 0,
        device: str | torch.device = "cpu",
        extra_init: float = 0.0,
        fast_rows: int | None = None,
        spill_directory: str | None = None,
        initializer_capacity: int | None = None,
        score_half_life_steps: int | None = None,
        column_offset: int = 0,
        extra_zeros: int = 0,
    ) -> None:
        init_capacity = args.check_sizes(
            dim, capacity, init_capacity, bucket_capacity, extra_columns, column_offset
        )
        if value_dtype not in _VALUE_DTYPES:
            raise TypeError(f"value_dtype must be one of {_VALUE_DTYPES}, got {value_dtype}")
        if not isinstance(seed, int) or not -(2**63) <= seed < 2**63:
            raise ValueError(f"seed must be an int64, got {seed!r}")
        initializer = initializer if initializer is not None else DynamicEmbInitializerArgs()
        if not isinstance(initializer, DynamicEmbInitializerArgs):
            raise TypeError(f"initializer must be DynamicEmbInitializerArgs, got {initializer!r}")
        initializer.validate()
        check_float32("extra_init", extra_init)
        args.check_int("extra_zeros", extra_zeros, 0)
        if extra_zeros > extra_columns:
            raise ValueError(
                f"extra_zeros must be <= extra_columns ({extra_columns}), got {extra_zeros}"
            )
        code = args.strategy_code(score_strategy)
        half_life = args.check_half_life(score_strategy, score_half_life_steps)
        if initializer_capacity is not None:
            args.check_int("initializer_capacity", initializer_capacity, 1)
        if fast_rows is not None:
            args.check_int("fast_rows", fast_rows, 0)
        if spill_directory is not None and fast_rows is None:
            fast_rows = 0
        layout = TableLayout(
            row_width=dim + extra_columns,
            bucket_capacity=bucket_capacity,
            value_dtype=value_dtype,
            keeps_scores=code != DynamicEmbScoreStrategy.NO_EVICTION.value,
            keeps_timestamps=code in args.TIMESTAMP_CODES,
            device=canonical_device(device),
            fast_rows=fast_rows,
        )
        args.check_capacity_bytes(capacity, layout.bytes_per_slot())
        spill = SpillDirectory(spill_directory) if spill_directory is not None else None

        self.dim = dim
        self.extra_columns = extra_columns
        self.score_strategy = score_strategy
        self.score_half_life_steps = half_life
        self.initializer = initializer
        self.seed = seed
        init_buckets, max_buckets = bucket_counts(init_capacity, capacity, bucket_capacity)
        bounds_for = initializer_capacity or capacity
        resolved = (float(v) for v in initializer.resolved(bounds_for))
        init = list(
            _ops.Init(*resolved, float(extra_init), float(column_offset), float(extra_zeros))
        )
        meta = spill.read_meta() if spill is not None else None
        size = step = 0
        if meta is None:
            storage = TableStorage(layout, init_buckets, spill)
        else:
            want = spill_meta(dim, layout, code, max_buckets)
            storage, size, step = reopen(spill, meta, want, layout)
        # Everything the ops change or share (see table_state.py); the clock is
        # ``state.clock`` (tests replace it to make timestamps predictable).
        self._state = TableState(
            dim, seed, layout, code, max_buckets, init, spill, storage, half_life, size, step
        )
        if spill is not None and meta is None:
            commit_spill(self._state)

    # ------------------------------------------------------------------ sizes

    @property
    def bucket_capacity(self) -> int:
        return self._state.layout.bucket_capacity

    @property
    def num_buckets(self) -> int:
        return self._state.storage.num_buckets

    @property
    def device(self) -> torch.device:
        return self._state.layout.device

    @property
    def value_dtype(self) -> torch.dtype:
        return self._state.layout.value_dtype

    def size(self) -> int:
        """Number of stored keys."""
        return self._state.size

    def capacity(self) -> int:
        """Slots currently allocated (grows up to ``max_capacity()``)."""
        return self._state.storage.num_slots

    def max_capacity(self) -> int:
        return self._state.max_buckets * self.bucket_capacity

    @property
    def keeps_scores(self) -> bool:
        """Whether a score is kept per slot (every strategy but NO_EVICTION)."""
        return self._state.layout.keeps_scores

    @property
    def keeps_timestamps(self) -> bool:
        """Whether a last-access time is kept per slot (the (TIMESTAMP, ...) compounds)."""
        return self._state.layout.keeps_timestamps

    @property
    def score_step(self) -> int:
        """Training lookups counted so far (the STEP strategy's score of the last batch)."""
        return self._state.step

    @score_step.setter
    def score_step(self, step: int) -> None:
        args.check_int("score_step", step, 0)
        self._state.step = step

    def now(self) -> int:
        """The clock of TIMESTAMP scores: host monotonic nanoseconds."""
        return self._state.clock()

    def load_factor(self) -> float:
        return self._state.size / self.capacity()

    def memory_usage(self) -> int:
        """Bytes of every buffer the table holds."""
        return self._state.storage.memory_bytes()

    # ------------------------------------------------------------ read-only ops

    def find(
        self, keys: torch.Tensor, out: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Looks keys up without changing anything (scores included).

        Args:
            keys: (n,) int64.
            out: optional (n, dim) contiguous tensor of the table's value dtype to write
                the rows into (saves allocating, and page-faulting, a new output).

        Returns:
            ``(values, found)``: (n, dim) rows (zeros where not found; ``out`` when
            given) and (n,) bool.
        """
        keys = self._check_keys(keys)
        out = self._output_rows(out, keys.numel())
        with self._state.lock.read():
            found = _ops.table_find(self._state.storage.tensors(), keys, out)
        return out, found

    def contains(self, keys: torch.Tensor) -> torch.Tensor:
        """Returns (n,) bool: whether each key is stored."""
        return self.find_slots(self._check_keys(keys)) >= 0

    def get_scores(self, keys: torch.Tensor) -> torch.Tensor:
        """Returns (n,) int64 scores (LFU count for the compound), 0 where not stored.

        Under NO_EVICTION no score is kept and every score is 0.
        """
        return self._gather_meta(self._check_keys(keys), "scores")

    def get_timestamps(self, keys: torch.Tensor) -> torch.Tensor:
        """Returns (n,) int64 last-access times of a (TIMESTAMP, ...) compound, 0 where not stored."""
        if not self._state.layout.keeps_timestamps:
            raise ValueError(
                f"get_timestamps needs a compound (TIMESTAMP, LFU) or (TIMESTAMP, DECAYED_LFU), this table uses {self.score_strategy}"
            )
        return self._gather_meta(self._check_keys(keys), "timestamps")

    # ------------------------------------------------------------- upsert ops

    def find_or_insert(
        self,
        keys: torch.Tensor,
        scores: torch.Tensor | None = None,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Returns each key's row, storing missing keys with initialised rows.

        Scores of every key are updated by the strategy (CUSTOMIZED: set to ``scores``).
        New keys take their rows from ``warm_start`` when it has them.
        Keys that could not be stored get their initial row, unstored, and are
        reported in ``last_stats``.

        Args:
            keys: (n,) int64.
            scores: (n,) int64 >= 0, required under CUSTOMIZED and refused otherwise.
            out: optional (n, dim) output, as in find.

        Returns:
            (n, dim) rows in the table's value dtype (``out`` when given).
        """
        keys = self._check_keys(keys)
        scores = self._check_scores(scores, keys)
        values = self._output_rows(out, keys.numel())
        upsert(
            self._state, _ops.table_find_or_insert, keys, scores, values, evicted=None, warm=True
        )
        return values

    def insert_or_assign(
        self, keys: torch.Tensor, values: torch.Tensor, scores: torch.Tensor | None = None
    ) -> BatchStats:
        """Stores ``values`` for each key (inserting or overwriting).

        Args:
            keys: (n,) int64.
            values: (n, dim), or (n, dim + extra_columns) to set the extra columns too
                (otherwise a new key's extra columns start at ``extra_init``).
            scores: as in find_or_insert.

        Returns:
            The batch's BatchStats (also in ``last_stats``).
        """
        keys = self._check_keys(keys)
        scores = self._check_scores(scores, keys)
        values = self._check_values(values, keys)
        return upsert(self._state, _ops.table_insert_or_assign, keys, scores, values, evicted=None)

    def insert_and_evict(
        self, keys: torch.Tensor, values: torch.Tensor, scores: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """insert_or_assign that returns the residents it evicted.

        Returns:
            ``(evicted_keys, evicted_values, evicted_scores)``: (m,) int64,
            (m, dim + extra_columns) full rows, (m,) int64.
        """
        keys = self._check_keys(keys)
        scores = self._check_scores(scores, keys)
        values = self._check_values(values, keys)
        evicted = self._state.evicted_buffers(keys.numel())
        status = upsert(
            self._state, _ops.table_insert_or_assign, keys, scores, values, evicted, True
        )
        mask = status == _ops.Status.EVICTED
        return evicted[0][mask], evicted[1][mask], evicted[2][mask]

    def erase(self, keys: torch.Tensor) -> int:
        """Removes keys; returns how many were stored."""
        return read_to_host(self.erase_keys(keys).sum(), "erased count").item()

    def erase_keys(self, keys: torch.Tensor) -> torch.Tensor:
        """Removes keys; returns (n,) bool: whether each was stored."""
        keys = self._check_keys(keys)
        with self._state.lock.write():
            return self.erase_held(keys)

    def clear(self) -> None:
        """Removes every key (capacity is kept)."""
        with self._state.lock.write():
            self._state.mutations += 1
            if self._state.change_log is not None:
                self._state.change_log.removed(self._state.stored_keys())
            self._state.storage.clear()
            self._state.size = 0

    def flush(self) -> None:
        """Spilled tables: makes the spill directory hold this exact table (rows,
        scores, sizes), so that a new ScoredHashTable with the same arguments and
        ``spill_directory`` reopens it. A no-op for a table in memory."""
        if self._state.spill is None:
            return
        with self._state.lock.write():
            commit_spill(self._state)

    # -------------------------------------------------------------- internals

    def _output_rows(self, out, n: int) -> torch.Tensor:
        return args.output_rows(out, n, self.dim, self.value_dtype, self.device)

    def _gather_meta(self, keys: torch.Tensor, name: str) -> torch.Tensor:
        with self._state.lock.read():
            slots = _ops.table_find_slots(self._state.storage.tensors(), keys)
            buf = getattr(self._state.storage, name)
            if buf.numel() == 0:
                return torch.zeros_like(keys)
            return torch.where(slots >= 0, buf[slots.clamp(min=0)], 0)

    def _check_keys(self, keys) -> torch.Tensor:
        return args.check_keys(keys, self.device)

    def _check_scores(self, scores, keys) -> torch.Tensor | None:
        customized = self._state.strategy == DynamicEmbScoreStrategy.CUSTOMIZED.value
        return args.check_scores(scores, keys, customized, self.score_strategy, self.device)

    def _check_values(self, values, keys) -> torch.Tensor:
        return args.check_values(
            values, keys, self.dim, self._state.layout.row_width, self.value_dtype, self.device
        )


__all__: Sequence[str] = ["ScoredHashTable", "BatchStats"]
