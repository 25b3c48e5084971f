"""``ScoredHashTable``: a bucketed hash table from any int64 key to a value row and a score.

The algorithm (probe, digest match, victim choice, score update) lives in
csrc/core and runs on the table's device through ``dynemb._ops``; this class
validates arguments and owns the table's state (a TableState: buffers, counters,
lock, logs), which it hands to the functions that implement its ops: growth.py (batch
upserts and growth), spill_persistence.py (the spill directory), slot_access.py
(entries for deltas, a cache's write-back, snapshots), entry_transfer.py (export and
restore). It implements the ``dynemb.table.Table`` protocol (protocol.py) of a table in
memory; dynemb.tiering's CachedTable implements it over two tiers.
"""

from collections.abc import Callable, Sequence

import torch

from dynemb import _ops
from dynemb._host_reads import read_to_host
from dynemb.config.table_options import DynamicEmbInitializerArgs, check_float32
from dynemb.config.types import DynamicEmbScoreStrategy
from dynemb.eviction_rules import RuleThresholds, stale_slots
from dynemb.table import batch_arguments as args
from dynemb.table import entry_transfer, lookup_undo, slot_access
from dynemb.table.batch_stats import BatchStats
from dynemb.table.capacity import bucket_counts
from dynemb.table.change_log import ChangeLog
from dynemb.table.growth import DeferredErase, hold_pins, slot_upsert, upsert
from dynemb.table.lookup_undo import LookupRecord
from dynemb.table.padded_keys import PaddedKeys
from dynemb.table.pin_ledger import PinHold
from dynemb.table.placement import canonical_device
from dynemb.table.rw_lock import RWLock
from dynemb.table.slot_access import TableSnapshot
from dynemb.table.spill_files import SpillDirectory
from dynemb.table.spill_persistence import commit_spill, reopen, spill_meta
from dynemb.table.table_state import TableState
from dynemb.table.table_storage import TableLayout, TableStorage
from dynemb.table.upsert_counts import TableTelemetry
from dynemb.warm_start.table_fill import TableFill

_VALUE_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


class ScoredHashTable:
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
        init_capacity: initial slots (``None``: ``capacity``); the table grows up to
            ``capacity`` as keys arrive: it doubles its buckets, or under NO_EVICTION
            grows them to a load of 0.74 (by 1.25x to 1.3x), a step.
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

    # ------------------------------------------------ the Table protocol: slots

    """The Table protocol and snapshots (a part of ScoredHashTable, over ``_state``)."""

    @property
    def state(self) -> TableState:
        """The table's TableState, which the helpers of dynemb.table (growth, spill,
        transfer, slots) work on; other code uses the Table protocol."""
        return self._state

    @property
    def strategy_code(self) -> int:
        """The score strategy's code (``DynamicEmbScoreStrategy`` value, or
        ``TIMESTAMP_LFU`` for the compound)."""
        return self._state.strategy

    @property
    def custom_score(self) -> int | None:
        """CUSTOMIZED: the score training lookups give the keys they touch (set by
        ``dynemb.incremental_dump.set_score``; None: never set, keys get 0)."""
        return self._state.custom_score

    @custom_score.setter
    def custom_score(self, score: int) -> None:
        args.check_int("custom_score", score, 0)
        if score > args.INT64_MAX:
            raise ValueError(f"custom_score must be <= {args.INT64_MAX} (int64), got {score}")
        self._state.custom_score = score

    @property
    def change_log(self) -> ChangeLog | None:
        """The log recording the keys this table touches and removes (dynemb.deltas),
        or None (the default: nothing is recorded)."""
        return self._state.change_log

    @change_log.setter
    def change_log(self, log: ChangeLog | None) -> None:
        if log is not None and not isinstance(log, ChangeLog):
            raise TypeError(f"change_log must be a ChangeLog or None, got {log!r}")
        with self._state.lock.write():  # no batch half recorded
            self._state.change_log = log

    @property
    def warm_start(self):
        """The ``dynemb.warm_start.TableFill`` whose source the keys a training lookup
        inserts read their first rows from (None, the default: the initializer's)."""
        return self._state.warm_start

    @warm_start.setter
    def warm_start(self, fill) -> None:
        if fill is not None and not isinstance(fill, TableFill):
            raise TypeError(f"warm_start must be a TableFill or None, got {fill!r}")
        with self._state.lock.write():
            self._state.warm_start = fill

    @property
    def last_stats(self) -> BatchStats | None:
        """The BatchStats of the latest batch upsert (None before the first)."""
        return self._state.last_stats

    @last_stats.setter
    def last_stats(self, stats: BatchStats | None) -> None:
        self._state.last_stats = stats

    @property
    def lock(self) -> RWLock:
        """Readers of ``buffers`` hold ``lock.read()``; every op that moves a key holds
        ``lock.write()``."""
        return self._state.lock

    @property
    def mutations(self) -> int:
        """Bumped by every op that may move or drop a stored key: slots read under an
        older count must be found again."""
        return self._state.mutations

    @property
    def buffers(self) -> TableStorage:
        """The buffers rows are read and written in by slot (valid under ``lock``;
        growth replaces them)."""
        return self._state.storage

    @property
    def init_values(self) -> list[float]:
        """The initializer list of the ops (``_ops.Init``'s fields)."""
        return list(self._state.init)

    def find_slots(self, keys: torch.Tensor) -> torch.Tensor:
        """Slots of keys ((n,) int64, -1 where not stored); changes nothing."""
        with self._state.lock.read():
            return _ops.table_find_slots(self._state.storage.tensors(), keys)

    def find_or_insert_slots(
        self, keys: torch.Tensor, accesses: torch.Tensor | None = None, hold=None
    ) -> tuple[torch.Tensor, BatchStats]:
        """Slots of distinct keys ((n,) int64, -1 where not stored), inserting missing
        keys with initialised rows (or ``warm_start``'s): a training lookup (scores
        updated by the strategy).

        ``accesses`` (n,) int64: the occurrences each key stands for (LFU counts them).
        ``hold``: the batch's PinHold (``hold_pins()``), which keeps the keys from
        eviction until released; None: they are pinned during this call only.
        """
        slots = keys.new_empty(0)  # the op's output becomes its storage (set_ below)
        scores = None
        if self._state.strategy == DynamicEmbScoreStrategy.CUSTOMIZED.value:
            scores = torch.full_like(keys, self._state.custom_score or 0)

        stats = upsert(
            self._state, slot_upsert, keys, scores, slots, evicted=None, slots=slots,
            per_key=accesses, hold=hold, warm=True,
        )  # fmt: skip
        return slots, stats

    def claim_cache_slots(
        self, keys: torch.Tensor | PaddedKeys, batch: int, floor: int, evicted_keys: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
        """A cache tier's claim (dynemb.tiering.cached_table): hits first (their batch
        number rises to ``batch``), then a slot for every other key without touching
        rows, evicting only residents of batches below ``floor`` (-1: any; the cache
        pins by these batch numbers, not by pin numbers). The caller
        holds ``lock.write()``. Returns ``(slots, status, counts)``; the evicted keys
        are written to ``evicted_keys``. ``keys`` may be padded: the claim is then
        bounded by their count on the device, read with its status counts, and the
        results are those of the distinct keys (``keys.sized()``)."""
        live = None
        if isinstance(keys, PaddedKeys):
            keys, live, padded = keys.unique, keys.live, keys
        policy = _ops.Policy(_ops.CACHE_SCORES, batch, self.seed, floor, self.dim)
        slots, status, counts = _ops.table_find_or_insert_slots(
            self._state.storage.tensors(), policy, self._state.init, keys, None, None,
            init_rows=False, evicted_keys=evicted_keys, live=live,
        )  # fmt: skip
        counts = read_to_host(counts, "status counts").tolist()  # the padded count rides along
        if live is not None:
            u = padded.count()
            keys, slots, status = keys[:u], slots[:u], status[:u]
        self._state.size += counts[_ops.Status.INSERTED]
        self._state.telemetry.after_upsert(status, keys, counts)  # counted, never sampled
        return slots, status, counts

    def erase_held(self, keys: torch.Tensor) -> torch.Tensor:
        """``erase_keys`` by a caller that holds ``lock.write()`` (a cache tier dropping
        keys mid-operation); ``keys`` (n,) int64 on the table's device, checked by the
        caller. Returns (n,) bool: whether each was stored."""
        self._state.mutations += 1
        erased = _ops.table_erase(self._state.storage.tensors(), keys)
        if self._state.change_log is not None:
            self._state.size -= read_to_host(erased.sum(), "erased count").item()
            self._state.change_log.removed(keys[erased])
        else:  # the size is read when needed: no wait here
            self._state.defer(DeferredErase(erased))
        return erased

    def rule_thresholds(self, rule):
        """``RuleThresholds`` of an ``EvictionRule`` for this table now (its step and
        clock, read once on the host)."""
        st = self._state
        return RuleThresholds.of(rule, st.strategy, st.step, st.clock(), st.score_half_life_steps)

    def erase_stale_buckets(self, thresholds, begin: int, end: int) -> tuple[torch.Tensor, int]:
        """Erases the keys of buckets ``[begin, end)`` that ``thresholds`` (RuleThresholds) say
        are stale, except those pinned by a batch in flight (pin >= the floor); one
        ``lock.write()`` for the scan and the erase. Returns ``(erased keys, number of
        buckets now)`` (a range past the end is cut)."""
        st = self._state
        with st.lock.write():
            s, cap = st.storage, st.layout.bucket_capacity
            n = s.num_buckets
            begin, end = min(begin, n), min(end, n)
            slots = s.occupied(begin * cap, end * cap)
            if slots.numel() == 0:
                return s.keys[:0], n
            stale = stale_slots(s, slots, thresholds, self.dim)
            stale &= s.pins[slots] < st.pins.floor()  # never a key of a batch in flight
            keys = s.keys[slots[stale]]
            if keys.numel():
                self.erase_held(keys)
        return keys, n

    def find_entries(self, keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Whole rows (embedding + extra columns) and scores of keys: ``(rows (n,
        row_width), scores (n,), found (n,) bool)``, zeros where not stored."""
        with self._state.lock.read():
            s = self._state.storage
            # One probe per key, then whole-batch gathers by slot (absent keys read
            # slot 0, then get zeros): probing twice, for rows and for scores, cost
            # more than the gathers.
            slots = _ops.table_find_slots(s.tensors(), keys)
            found = slots >= 0
            at = slots.clamp(min=0)
            rows = s.rows(at, self._state.layout.row_width)
            scores = s.scores[at] if self._state.layout.keeps_scores else torch.zeros_like(keys)
        missing = ~found
        rows.index_fill_(0, torch.nonzero(missing, as_tuple=True)[0], 0)  # those rows only
        return rows, scores.masked_fill_(missing, 0), found

    def stored_entries(
        self, keys: torch.Tensor, out: Callable[[str, int, int, torch.dtype], torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """The entries of the keys stored, each once: ``(stored (m,) int64, rows (m,
        row_width), scores (m,) int64, missing (k,) int64)``, ``missing`` the keys not
        stored (repeats kept). ``keys`` may repeat: they are de-duplicated by slot (a
        mark per slot; a sort of the slots when they are few), the keys not sorted, and
        the m entries come in slot order, which makes the gathers walk memory forwards
        (one W-train table, 550k keys recorded 1.19M times, 1 thread: 208 ms against
        384 ms for a sort of the keys and a gather in key order). On a host table the rows
        and scores are written into ``out("rows", m, row_width, dtype)`` and
        ``out("scores", m, 0, torch.int64)`` (a publisher's reused buffers); on a GPU
        they stay on it."""
        return slot_access.stored_entries(self._state, keys, out)

    def write_back(
        self,
        keys: torch.Tensor,
        rows: torch.Tensor,
        scores: torch.Tensor,
        timestamps: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Stores distinct keys with whole rows and exactly these scores (CUSTOMIZED
        admits by them), not counting a step: a cache's write-back. ``timestamps``:
        (n,) int64 last-access times a compound (TIMESTAMP, ...) table stores with them
        (None: the write-back's clock, as a restore without them).

        Returns ``(keys, rows, scores)`` of every entry the table no longer holds:
        the residents evicted, then the given keys that could not be stored.
        """
        status, evicted = slot_access.write_back_upsert(
            self._state, keys, rows, scores, timestamps, defer=False
        )
        stats = self._state.last_stats
        if not stats.evicted and not stats.failed:  # the common case: nothing to report
            return evicted[0][:0], evicted[1][:0], evicted[2][:0]
        out = status == _ops.Status.EVICTED
        lost = status == _ops.Status.FAILED
        if not read_to_host(lost.any(), "any failed").item():
            return evicted[0][out], evicted[1][out], evicted[2][out]
        return (
            torch.cat([evicted[0][out], keys[lost]]),
            torch.cat([evicted[1][out], rows[lost]]),
            torch.cat([evicted[2][out], scores[lost]]),
        )

    def write_back_counted(
        self,
        keys: torch.Tensor,
        rows: torch.Tensor,
        scores: torch.Tensor,
        timestamps: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``write_back`` that returns only how many entries the table no longer holds
        (residents evicted + keys not stored), a 0-dim int64 tensor on the table's
        device: nothing is read now where the table cannot grow (its status counts
        are read with the next read, as a deferred lookup's)."""
        status, _ = slot_access.write_back_upsert(
            self._state, keys, rows, scores, timestamps, defer=True
        )
        return ((status == _ops.Status.EVICTED) | (status == _ops.Status.FAILED)).sum()

    def assign_scored(self, keys: torch.Tensor, values: torch.Tensor, scores: torch.Tensor):
        """``insert_or_assign`` of arguments the caller built valid (distinct (n,)
        int64 keys on the table's device, (n, dim) values of its dtype, (n,) int64
        scores >= 0), unchecked: nothing is read now where the table cannot grow
        (its status counts are read later). Returns the BatchStats or DeferredLookup."""
        return upsert(
            self._state, _ops.table_insert_or_assign, keys, scores, values, evicted=None,
            defer=True,
        )  # fmt: skip

    def snapshot(self) -> TableSnapshot:
        """A copy of every buffer and counter, for ``rollback`` (e.g. to rerun a batch
        op from one state, or undo a batch). Costs the table's memory once more."""
        return slot_access.snapshot(self._state)

    def rollback(self, snapshot: TableSnapshot) -> None:
        """Restores the table in place to ``snapshot`` (its buffers are reused).

        Raises:
            TypeError: ``snapshot`` is not a TableSnapshot.
            ValueError: the snapshot was taken from another table, or the table grew since the snapshot (its buffers were replaced).
                Nothing changes then.
        """
        slot_access.rollback(self._state, snapshot)

    # ---------------------------- the Table protocol: batches, reads, checkpoints

    """The TBE module's and the checkpoints' Table members of a table in memory (a part of
    ScoredHashTable, over ``_state``)."""

    has_cache = False  # prefetch, cache_stats and empty_cache do nothing

    takes_padded_keys = False  # its lookups defer their reads: it needs the keys sized

    def hold_pins(self) -> PinHold:
        """A batch in flight for ``find_or_insert_slots(..., hold=)``: the keys its
        lookups find or store are not evicted until ``release()`` (a training
        forward releases it once its backward has written the rows)."""
        return self._hold_locked()

    def begin_batch(self) -> PinHold:
        """A training forward starts: its keys are pinned until ``end_batch`` (or until
        the hold is dropped), and the change log, if any, is told that its backward
        will write their rows (a delta's seal waits for them)."""
        log = self._state.change_log
        if log is not None:
            log.begin_writes()
        return self._hold_locked()

    def _hold_locked(self) -> PinHold:
        # Under the write guard: a hold may renumber the pins buffer in place, which no
        # op of another thread (nor, on a GPU, of another stream) may see half done.
        with self._state.lock.write():
            return hold_pins(self._state)

    def skip_batch(self) -> None:
        """A training forward without keys of this table: nothing to do."""

    def batch_rows(
        self, slots: torch.Tensor, batch: PinHold
    ) -> tuple[TableStorage | None, torch.Tensor]:
        """Where a training forward reads its distinct keys' rows: ``(None, slots)``,
        the table's ``buffers`` (under ``lock.read()``) at their slots."""
        return None, slots

    def widen_batch(self, batch: PinHold, positions: torch.Tensor, count: int) -> None:
        """A lookup of some of a forward's keys: nothing to re-address (no staged rows)."""

    def staged_rows(self, batch: PinHold) -> tuple[TableStorage, torch.Tensor] | None:
        """Rows of the batch held outside ``buffers``: none in a table in memory."""
        return None

    def end_batch(self, batch: PinHold) -> None:
        """The batch's backward wrote its rows (or its forward failed): its keys may be
        evicted again and the change log's pending writes are done."""
        batch.release()
        log = self._state.change_log
        if log is not None:
            log.end_writes()

    def batches_in_flight(self) -> int:
        """Training forwards before their backward (and one-off upserts running)."""
        return self._state.pins.in_flight()

    def eval_rows(self, keys: torch.Tensor) -> tuple[TableStorage | None, torch.Tensor]:
        """Where an eval lookup reads distinct keys' rows: ``(None, slots)``, the
        table's ``buffers`` at their slots (-1: not stored); inserts nothing."""
        return None, self.find_slots(keys)

    def prefetch(self, keys: torch.Tensor) -> None:
        """No cache to fill: nothing to do (returns no batch number)."""
        return None

    def upcoming_batch(self) -> None:
        """No prefetched batch waits (a cache's next forward's number, else None)."""
        return None

    @property
    def cache_stats(self) -> None:
        """A cache's CacheStats; None for a table without one."""
        return None

    @property
    def telemetry(self) -> TableTelemetry:
        """What this table's batch upserts did (dynemb.table.upsert_counts); the lookups
        whose status counts were deferred are counted first (one read of the device)."""
        self._state.settle()
        return self._state.telemetry

    @property
    def groups_lookups(self) -> bool:
        """Whether training lookups may run in ``growth.find_or_insert_slots_grouped``:
        no change log (its lookups report the residents they evict) and not CUSTOMIZED
        (its lookups carry scores)."""
        return (
            self._state.change_log is None
            and self._state.strategy != DynamicEmbScoreStrategy.CUSTOMIZED.value
        )

    def record_lookup(self, keys: torch.Tensor) -> LookupRecord:
        """What a training lookup of distinct ``keys`` may change, for
        ``dynemb.table.lookup_undo.undo``."""
        return lookup_undo.record(self, keys)

    def persistent_table(self):
        """The table a checkpoint dumps and loads: this one."""
        return self

    def empty_cache(self) -> None:
        """No cache to empty before a load: nothing to do."""

    # ------------------------------------------------------- saved entries

    def export_batch(
        self, offset: int, n: int, include_extra: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
        """Exports the live entries of slots ``[offset, offset + n)``.

        Iterating ``offset = 0, next_offset, ...`` until ``next_offset == capacity()``
        visits every live entry exactly once, provided the table does not change
        in between.

        Args:
            offset: first slot, in [0, capacity()].
            n: number of slots to scan (> 0).
            include_extra: also return the extra (optimizer state) columns.

        Returns:
            ``(keys, values, scores, next_offset)``: (m,) int64, (m, dim or dim + extra),
            (m,) int64, and the slot to continue from.
        """
        return entry_transfer.export_batch(self._state, offset, n, include_extra)

    def restore(
        self,
        keys: torch.Tensor,
        values: torch.Tensor,
        state: torch.Tensor | None = None,
        scores: torch.Tensor | None = None,
        timestamps: torch.Tensor | None = None,
    ) -> BatchStats:
        """Stores saved entries exactly as a checkpoint holds them, in one pass.

        Each key gets its embedding columns, optimizer state, score and timestamp
        (nothing is re-scored by the strategy); a key already stored is overwritten.
        Placement follows insert_or_assign: the table grows while below capacity,
        then a full bucket evicts its lowest (score, digest, key) resident (CUSTOMIZED refuses
        a newcomer ranking below it), and keys that fit nowhere are reported failed.
        Under NO_EVICTION a key whose two buckets are full takes a slot freed by moving
        a resident, row and all, to its other bucket (or two or three in a chain), so
        that a table saved at its max capacity restores whole from its entries in slot
        order; in another order a few keys may still find no room at the highest loads.

        Args:
            keys: (n,) int64, distinct.
            values: (n, dim) contiguous, the table's value dtype.
            state: (n, extra_columns) contiguous optimizer state, or None (a new
                key's extra columns start at ``extra_init``).
            scores: (n,) int64 saved scores (>= 0); required under CUSTOMIZED, refused under
                NO_EVICTION (no score is kept); None keeps the strategy's score.
            timestamps: (n,) int64 last-access times (>= 0), (TIMESTAMP, LFU) tables only.

        Returns:
            The batch's BatchStats (also in ``last_stats``).

        Raises:
            ValueError: a key given twice (naming it and its positions), a negative
                score or timestamp (naming it and its key), or another bad argument;
                nothing is stored then.

        Example::

            >>> t.restore(torch.tensor([5, 9]), torch.zeros(2, t.dim), scores=torch.tensor([3, 1]))
        """
        keys = self._check_keys(keys)
        args.check_distinct("restore", keys)
        values = args.check_values(values, keys, self.dim, self.dim, self.value_dtype, self.device)
        if state is not None:
            width = self.extra_columns
            state = args.check_values(state, keys, width, width, self.value_dtype, self.device)
        if self._state.strategy == DynamicEmbScoreStrategy.CUSTOMIZED.value and scores is None:
            raise ValueError("restore: `scores` are required under the CUSTOMIZED strategy")
        for name, meta, kept in (
            ("scores", scores, self._state.layout.keeps_scores),
            ("timestamps", timestamps, self._state.layout.keeps_timestamps),
        ):
            if meta is not None and not kept:
                raise ValueError(
                    f"restore: `{name}` given, but a {self.score_strategy} table keeps none"
                )
        scores = args.check_meta("scores", scores, keys, self.device)
        timestamps = args.check_meta("timestamps", timestamps, keys, self.device)
        return entry_transfer.restore(self._state, keys, (values, state, scores, timestamps))

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
