"""``ScoredHashTable``: a bucketed hash table from any int64 key to a value row and a score.

The algorithm (probe, digest match, victim choice, score update) lives in
csrc/core and runs on the table's device through ``dynemb._ops``; this class
validates arguments, owns the buffers, drives growth and keeps the accounting.
"""

import dataclasses
import time
from collections.abc import Sequence

import torch

from dynemb import _ops
from dynemb.dynamicemb_config import DynamicEmbInitializerArgs
from dynemb.table import batch_arguments as args
from dynemb.table.capacity import bucket_counts
from dynemb.table.rw_lock import RWLock
from dynemb.table.spill_files import SpillDirectory
from dynemb.table.table_storage import TableLayout, TableStorage
from dynemb.types import DynamicEmbScoreStrategy

_VALUE_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


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
        init_capacity: initial slots (``None``: ``capacity``); the table doubles up to
            ``capacity`` as keys arrive.
        bucket_capacity: slots per bucket, a positive multiple of 16.
        score_strategy: a DynamicEmbScoreStrategy or ``(TIMESTAMP, LFU)``.
        value_dtype: storage type of rows: float32, float16 or bfloat16.
        extra_columns: columns stored after the embedding (optimizer state), set to
            ``extra_init`` for new keys.
        initializer: how new rows are initialised; a function of (seed, key).
        seed: initializer seed.
        device: where the table lives (CPU always; CUDA in CUDA builds).
        extra_init: initial value of the extra columns.
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
    ) -> None:
        args.check_int("dim", dim, 1)
        args.check_int("bucket_capacity", bucket_capacity, 16)
        if bucket_capacity % 16:
            raise ValueError(f"bucket_capacity must be a multiple of 16, got {bucket_capacity}")
        args.check_int("capacity", capacity, bucket_capacity, "bucket_capacity")
        if init_capacity is None:
            init_capacity = capacity
        args.check_int("init_capacity", init_capacity, 1)
        if init_capacity > capacity:
            raise ValueError(f"init_capacity={init_capacity} exceeds capacity={capacity}")
        args.check_int("extra_columns", extra_columns, 0)
        if value_dtype not in _VALUE_DTYPES:
            raise TypeError(f"value_dtype must be one of {_VALUE_DTYPES}, got {value_dtype}")
        if not isinstance(seed, int) or not -(2**63) <= seed < 2**63:
            raise ValueError(f"seed must be an int64, got {seed!r}")
        initializer = initializer if initializer is not None else DynamicEmbInitializerArgs()
        if not isinstance(initializer, DynamicEmbInitializerArgs):
            raise TypeError(f"initializer must be DynamicEmbInitializerArgs, got {initializer!r}")
        initializer.validate()
        code = args.strategy_code(score_strategy)
        if initializer_capacity is not None:
            args.check_int("initializer_capacity", initializer_capacity, 1)
        if fast_rows is not None:
            args.check_int("fast_rows", fast_rows, 0)
        spill = SpillDirectory(spill_directory) if spill_directory is not None else None
        if spill is not None and fast_rows is None:
            fast_rows = 0

        self.dim = dim
        self.extra_columns = extra_columns
        self.score_strategy = score_strategy
        self.initializer = initializer
        self.seed = seed
        self._strategy = code
        self._layout = TableLayout(
            row_width=dim + extra_columns,
            bucket_capacity=bucket_capacity,
            value_dtype=value_dtype,
            keeps_scores=code != DynamicEmbScoreStrategy.NO_EVICTION.value,
            keeps_timestamps=code == args.TIMESTAMP_LFU,
            device=torch.device(device),
            fast_rows=fast_rows,
        )
        init_buckets, self._max_buckets = bucket_counts(init_capacity, capacity, bucket_capacity)
        bounds_for = initializer_capacity or capacity
        self._init = [float(v) for v in initializer.resolved(bounds_for)] + [float(extra_init)]
        self._size = 0
        self._step = 0
        self._spill = spill
        meta = spill.read_meta() if spill is not None else None
        if meta is None:
            self._storage = TableStorage(self._layout, init_buckets, spill)
            if spill is not None:
                self._commit_spill()
        else:
            self._reopen(meta)
        self._lock = RWLock()
        self._clock = time.monotonic_ns  # tests replace it to make timestamps predictable
        # CUSTOMIZED: the score training lookups give the keys they touch (set by
        # dynemb.incremental_dump.set_score; None: never set, keys get 0).
        self._custom_score: int | None = None
        self._mutations = 0  # bumped by every op that may move or drop a key
        self._generation = 0  # bumped when growth replaces the storage
        self.last_stats: BatchStats | None = None

    # ------------------------------------------------------------------ sizes

    @property
    def bucket_capacity(self) -> int:
        return self._layout.bucket_capacity

    @property
    def num_buckets(self) -> int:
        return self._storage.num_buckets

    @property
    def device(self) -> torch.device:
        return self._layout.device

    @property
    def value_dtype(self) -> torch.dtype:
        return self._layout.value_dtype

    def size(self) -> int:
        """Number of stored keys."""
        return self._size

    def capacity(self) -> int:
        """Slots currently allocated (grows up to ``max_capacity()``)."""
        return self._storage.num_slots

    def max_capacity(self) -> int:
        return self._max_buckets * self.bucket_capacity

    @property
    def keeps_scores(self) -> bool:
        """Whether a score is kept per slot (every strategy but NO_EVICTION)."""
        return self._layout.keeps_scores

    @property
    def keeps_timestamps(self) -> bool:
        """Whether a last-access time is kept per slot (the (TIMESTAMP, LFU) compound)."""
        return self._layout.keeps_timestamps

    @property
    def score_step(self) -> int:
        """Training lookups counted so far (the STEP strategy's score of the last batch)."""
        return self._step

    @score_step.setter
    def score_step(self, step: int) -> None:
        args.check_int("score_step", step, 0)
        self._step = step

    def now(self) -> int:
        """The clock of TIMESTAMP scores: host monotonic nanoseconds."""
        return self._clock()

    def load_factor(self) -> float:
        return self._size / self.capacity()

    def memory_usage(self) -> int:
        """Bytes of every buffer the table holds."""
        return self._storage.memory_bytes()

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
        with self._lock.read():
            found = _ops.table_find(self._storage.tensors(), keys, out)
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
        """Returns (n,) int64 last-access times of the (TIMESTAMP, LFU) compound, 0 where not stored."""
        if not self._layout.keeps_timestamps:
            raise ValueError(
                f"get_timestamps needs the (TIMESTAMP, LFU) strategy, this table uses {self.score_strategy}"
            )
        return self._gather_meta(self._check_keys(keys), "timestamps")

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
        args.check_int("n", n, 1)
        with self._lock.read():
            cap = self.capacity()
            if not isinstance(offset, int) or not 0 <= offset <= cap:
                raise ValueError(f"offset must be an int in [0, capacity()={cap}], got {offset!r}")
            end = min(cap, offset + n)
            s = self._storage
            slots = s.occupied(offset, end)
            width = self._layout.row_width if include_extra else self.dim
            keys = s.keys[slots]
            values = s.rows(slots, width)
            scores = s.scores[slots] if self._layout.keeps_scores else torch.zeros_like(keys)
        return keys, values, scores, end

    # ------------------------------------------------------------- upsert ops

    def find_or_insert(
        self,
        keys: torch.Tensor,
        scores: torch.Tensor | None = None,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Returns each key's row, storing missing keys with initialised rows.

        Scores of every key are updated by the strategy (CUSTOMIZED: set to ``scores``).
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
        self._upsert(_ops.table_find_or_insert, keys, scores, values, evicted=None)
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
        return self._upsert(_ops.table_insert_or_assign, keys, scores, values, evicted=None)

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
        n = keys.numel()
        evicted = [
            torch.empty(n, dtype=torch.int64, device=self.device),
            torch.empty((n, self._layout.row_width), dtype=self.value_dtype, device=self.device),
            torch.empty(n, dtype=torch.int64, device=self.device),
        ]
        status = self._upsert(_ops.table_insert_or_assign, keys, scores, values, evicted, True)
        mask = status == _ops.Status.EVICTED
        return evicted[0][mask], evicted[1][mask], evicted[2][mask]

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

        Args:
            keys: (n,) int64, distinct.
            values: (n, dim) contiguous, the table's value dtype.
            state: (n, extra_columns) contiguous optimizer state, or None (a new
                key's extra columns start at ``extra_init``).
            scores: (n,) int64 saved scores; required under CUSTOMIZED, refused under
                NO_EVICTION (no score is kept); None keeps the strategy's score.
            timestamps: (n,) int64 last-access times, (TIMESTAMP, LFU) tables only.

        Returns:
            The batch's BatchStats (also in ``last_stats``).

        Example::

            >>> t.restore(torch.tensor([5, 9]), torch.zeros(2, t.dim), scores=torch.tensor([3, 1]))
        """
        keys = self._check_keys(keys)
        n = keys.numel()
        values = args.check_values(values, keys, self.dim, self.dim, self.value_dtype, self.device)
        if state is not None:
            width = self.extra_columns
            state = args.check_values(state, keys, width, width, self.value_dtype, self.device)
        if self._strategy == DynamicEmbScoreStrategy.CUSTOMIZED.value and scores is None:
            raise ValueError("restore: `scores` are required under the CUSTOMIZED strategy")
        for name, meta, kept in (
            ("scores", scores, self._layout.keeps_scores),
            ("timestamps", timestamps, self._layout.keeps_timestamps),
        ):
            if meta is not None and not kept:
                raise ValueError(
                    f"restore: `{name}` given, but a {self.score_strategy} table keeps none"
                )
        scores = args.check_meta("scores", scores, keys, self.device)
        timestamps = args.check_meta("timestamps", timestamps, keys, self.device)
        saved = (values, state, scores, timestamps)

        def op(table, policy, init, k, _scores, _rows, _evicted, per_key):
            # per_key: positions in the batch (all of them, or the retried ones).
            sub = saved if per_key.numel() == n else [_subset(t, per_key) for t in saved]
            return _ops.UpsertResult(*_ops.table_restore(table, policy, init, k, *sub))

        positions = torch.arange(n, device=self.device)
        # `positions` stands in for the row buffer too: op gathers its own inputs.
        return self._upsert(op, keys, None, positions, evicted=None, per_key=positions)

    def erase(self, keys: torch.Tensor) -> int:
        """Removes keys; returns how many were stored."""
        return int(self.erase_keys(keys).sum())

    def erase_keys(self, keys: torch.Tensor) -> torch.Tensor:
        """Removes keys; returns (n,) bool: whether each was stored."""
        keys = self._check_keys(keys)
        with self._lock.write():
            self._mutations += 1
            erased = _ops.table_erase(self._storage.tensors(), keys)
            self._size -= int(erased.sum())
        return erased

    def clear(self) -> None:
        """Removes every key (capacity is kept)."""
        with self._lock.write():
            self._mutations += 1
            self._storage.clear()
            self._size = 0

    def flush(self) -> None:
        """Spilled tables: makes the spill directory hold this exact table (rows,
        scores, sizes), so that a new ScoredHashTable with the same arguments and
        ``spill_directory`` reopens it. A no-op for a table in memory."""
        if self._spill is None:
            return
        with self._lock.write():
            self._commit_spill()

    # -------------------------------------------------------------- internals

    def _spill_meta(self) -> dict:
        layout = self._layout
        return {
            "dim": self.dim,
            "row_width": layout.row_width,
            "bucket_capacity": layout.bucket_capacity,
            "value_dtype": str(layout.value_dtype),
            "strategy": self._strategy,
            "max_buckets": self._max_buckets,
            "fast_rows": layout.fast_rows,
        }

    def _commit_spill(self) -> None:
        storage = self._storage
        storage.sync()
        state = {"num_buckets": storage.num_buckets, "generation": storage.generation}
        state["step"] = self._step
        self._spill.write_meta({"layout": self._spill_meta(), "state": state})
        self._spill.remove_generations_except(storage.generation)

    def _reopen(self, meta: dict) -> None:
        want = self._spill_meta()
        for name, value in want.items():
            if meta["layout"].get(name) != value:
                raise ValueError(
                    f"spill directory {self._spill.path!r} holds a table with {name}="
                    f"{meta['layout'].get(name)!r}, these arguments give {name}={value!r}"
                )
        state = meta["state"]
        self._storage = TableStorage(
            self._layout, state["num_buckets"], self._spill, state["generation"], reopen=True
        )
        self._size = int(torch.count_nonzero(self._storage.digests))
        self._step = state["step"]

    def _output_rows(self, out, n: int) -> torch.Tensor:
        return args.output_rows(out, n, self.dim, self.value_dtype, self.device)

    def _upsert(
        self, op, keys, scores, values, evicted, return_status=False, slots=None, per_key=None
    ):
        """Runs a batch upsert, growing the table and retrying the keys that failed.

        ``per_key`` is an extra (n,) tensor passed to ``op`` (and subset on retries).
        """
        with self._lock.write():
            generation = self._generation  # not the storage itself: growth must free it
            self._mutations += 1
            self._step += 1
            batch_value = self._step if self._strategy == DynamicEmbScoreStrategy.STEP.value else 0
            if self._strategy in (DynamicEmbScoreStrategy.TIMESTAMP.value, args.TIMESTAMP_LFU):
                batch_value = int(self._clock())
            extra = {} if per_key is None else {"per_key": per_key}
            status, counts = op(
                self._storage.tensors(), self._policy(batch_value), self._init,
                keys, scores, values, evicted or [], **extra,
            )  # fmt: skip
            counts = counts.tolist()
            while counts[_ops.Status.FAILED] and self.num_buckets < self._max_buckets:
                if not self._grow():
                    break
                status, counts = self._retry_failed(
                    op, keys, scores, values, evicted, status, counts, batch_value, per_key
                )
            self._size += counts[_ops.Status.INSERTED]
            if slots is not None and self._generation != generation:
                slots.copy_(_ops.table_find_slots(self._storage.tensors(), keys))  # moved by growth
            failed = counts[_ops.Status.FAILED]
            failed_keys = keys[status == _ops.Status.FAILED] if failed else keys[:0]
            stats = BatchStats(*counts, failed_keys=failed_keys)
            self.last_stats = stats
        return status if return_status else stats

    def _retry_failed(
        self, op, keys, scores, values, evicted, status, counts, batch_value, per_key=None
    ):
        """Re-runs the failed positions of a batch on the grown table, in batch order."""
        pos = torch.nonzero(status == _ops.Status.FAILED, as_tuple=True)[0]
        sub_values = values[pos].contiguous()
        sub_evicted = [t[pos].contiguous() for t in evicted] if evicted else []
        sub_scores = scores[pos].contiguous() if scores is not None else None
        extra = {} if per_key is None else {"per_key": per_key[pos].contiguous()}
        sub_status, sub_counts = op(
            self._storage.tensors(), self._policy(batch_value), self._init,
            keys[pos].contiguous(), sub_scores, sub_values, sub_evicted, **extra,
        )  # fmt: skip
        values[pos] = sub_values  # find_or_insert writes rows; assign leaves them as given
        for full, part in zip(evicted or [], sub_evicted):
            full[pos] = part
        status = status.clone()
        status[pos] = sub_status
        counts = [c for c in counts]
        counts[_ops.Status.FAILED] = 0
        return status, [a + b for a, b in zip(counts, sub_counts.tolist())]

    # ------------------------------------------- slot interface (dynemb.table.Table)

    @property
    def strategy_code(self) -> int:
        """The score strategy's code (``DynamicEmbScoreStrategy`` value, or
        ``TIMESTAMP_LFU`` for the compound)."""
        return self._strategy

    @property
    def custom_score(self) -> int | None:
        """CUSTOMIZED: the score training lookups give the keys they touch (set by
        ``dynemb.incremental_dump.set_score``; None: never set, keys get 0)."""
        return self._custom_score

    @custom_score.setter
    def custom_score(self, score: int) -> None:
        args.check_int("custom_score", score, 0)
        self._custom_score = score

    @property
    def lock(self) -> RWLock:
        """Readers of ``buffers`` hold ``lock.read()``; every op that moves a key holds
        ``lock.write()``."""
        return self._lock

    @property
    def mutations(self) -> int:
        """Bumped by every op that may move or drop a stored key: slots read under an
        older count must be found again."""
        return self._mutations

    @property
    def buffers(self) -> TableStorage:
        """The buffers rows are read and written in by slot (valid under ``lock``;
        growth replaces them)."""
        return self._storage

    @property
    def init_values(self) -> list[float]:
        """The initializer list of the ops (``[mode, a, b, lower, upper, extra_init]``)."""
        return list(self._init)

    def find_slots(self, keys: torch.Tensor) -> torch.Tensor:
        """Slots of keys ((n,) int64, -1 where not stored); changes nothing."""
        with self._lock.read():
            return _ops.table_find_slots(self._storage.tensors(), keys)

    def find_or_insert_slots(
        self, keys: torch.Tensor, accesses: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, BatchStats]:
        """Slots of distinct keys ((n,) int64, -1 where not stored), inserting missing
        keys with initialised rows: a training lookup (scores updated by the strategy).

        ``accesses`` (n,) int64: the occurrences each key stands for (LFU counts them).
        """
        slots = torch.empty_like(keys)
        scores = None
        if self._strategy == DynamicEmbScoreStrategy.CUSTOMIZED.value:
            scores = torch.full_like(keys, self._custom_score or 0)

        def op(table, policy, init, k, scores, out, evicted, per_key=None):
            found, status, counts = _ops.table_find_or_insert_slots(
                table, policy, init, k, scores, per_key
            )
            out.copy_(found)
            return _ops.UpsertResult(status, counts)

        stats = self._upsert(op, keys, scores, slots, evicted=None, slots=slots, per_key=accesses)
        return slots, stats

    def claim_cache_slots(
        self, keys: torch.Tensor, batch: int, floor: int, evicted_keys: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
        """A cache tier's claim (dynemb.tiering.cached_table): hits first (their batch
        number rises to ``batch``), then a slot for every other key without touching
        rows, evicting only residents of batches below ``floor`` (-1: any). The caller
        holds ``lock.write()``. Returns ``(slots, status, counts)``; the evicted keys
        are written to ``evicted_keys``."""
        policy = _ops.Policy(_ops.CACHE_SCORES, batch, self.seed, floor, self.dim)
        slots, status, counts = _ops.table_find_or_insert_slots(
            self._storage.tensors(), policy, self._init, keys, None, None,
            init_rows=False, evicted_keys=evicted_keys, hits_first=True,
        )  # fmt: skip
        counts = counts.tolist()
        self._size += counts[_ops.Status.INSERTED]
        return slots, status, counts

    def find_entries(self, keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Whole rows (embedding + extra columns) and scores of keys: ``(rows (n,
        row_width), scores (n,), found (n,) bool)``, zeros where not stored."""
        with self._lock.read():
            s = self._storage
            # One probe per key, then whole-batch gathers by slot (absent keys read
            # slot 0, then get zeros): probing twice, for rows and for scores, cost
            # more than the gathers.
            slots = _ops.table_find_slots(s.tensors(), keys)
            found = slots >= 0
            at = slots.clamp(min=0)
            rows = s.rows(at, self._layout.row_width)
            scores = s.scores[at] if self._layout.keeps_scores else torch.zeros_like(keys)
        missing = ~found
        rows.index_fill_(0, torch.nonzero(missing, as_tuple=True)[0], 0)  # those rows only
        return rows, scores.masked_fill_(missing, 0), found

    def write_back(
        self, keys: torch.Tensor, rows: torch.Tensor, scores: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Stores distinct keys with whole rows and exactly these scores (CUSTOMIZED
        admits by them), not counting a step: a cache's write-back.

        Returns ``(keys, rows, scores)`` of every entry the table no longer holds:
        the residents evicted, then the given keys that could not be stored.
        """
        n, width = keys.numel(), self._layout.row_width
        rows = rows.contiguous()
        saved_scores = scores.contiguous() if self._layout.keeps_scores else None
        evicted = [
            torch.empty(n, dtype=torch.int64, device=self.device),
            torch.empty((n, width), dtype=self.value_dtype, device=self.device),
            torch.empty(n, dtype=torch.int64, device=self.device),
        ]

        def op(table, policy, init, k, _scores, _values, ev, per_key):
            # One pass: whole rows (policy dim = row width) and their scores exactly as
            # given; per_key: the positions (re)tried.
            part = per_key.numel() != n
            r = rows[per_key] if part else rows
            sc = saved_scores[per_key] if part and saved_scores is not None else saved_scores
            policy = policy._replace(dim=width)
            return _ops.table_restore(table, policy, init, k, r, None, sc, None, ev)

        step = self._step  # a write-back is not a training step (STEP scores count those)
        positions = torch.arange(n, device=self.device)
        status = self._upsert(
            op, keys, None, positions, evicted, return_status=True, per_key=positions
        )
        self._step = step
        stats = self.last_stats
        if not stats.evicted and not stats.failed:  # the common case: nothing to report
            return evicted[0][:0], evicted[1][:0], evicted[2][:0]
        out = status == _ops.Status.EVICTED
        lost = status == _ops.Status.FAILED
        if not bool(lost.any()):
            return evicted[0][out], evicted[1][out], evicted[2][out]
        return (
            torch.cat([evicted[0][out], keys[lost]]),
            torch.cat([evicted[1][out], rows[lost]]),
            torch.cat([evicted[2][out], scores[lost]]),
        )

    def _policy(self, batch_value: int) -> _ops.Policy:
        # Below capacity a full bucket grows the table instead of evicting.
        evict_below = _ops.EVICT_ANY if self.num_buckets == self._max_buckets else 0
        return _ops.Policy(self._strategy, batch_value, self.seed, evict_below, self.dim)

    def _grow(self) -> bool:
        """Doubles the bucket count; returns False (table unchanged) if a rehash failed."""
        old = self._storage
        buckets = min(2 * old.num_buckets, self._max_buckets)
        new = TableStorage(self._layout, buckets, self._spill, old.generation + 1)
        window = _ops.spill_window(self._strategy, buckets)
        if _ops.table_rehash(old.tensors(), new.tensors(), window):
            if self._spill is not None:
                self._spill.remove_generations_except(old.generation)
            return False
        self._storage = new
        self._generation += 1
        if self._spill is not None:  # the committed state must not name a removed generation
            self._commit_spill()
        return True

    def _gather_meta(self, keys: torch.Tensor, name: str) -> torch.Tensor:
        with self._lock.read():
            slots = _ops.table_find_slots(self._storage.tensors(), keys)
            buf = getattr(self._storage, name)
            if buf.numel() == 0:
                return torch.zeros_like(keys)
            return torch.where(slots >= 0, buf[slots.clamp(min=0)], 0)

    def _check_keys(self, keys) -> torch.Tensor:
        return args.check_keys(keys, self.device)

    def _check_scores(self, scores, keys) -> torch.Tensor | None:
        customized = self._strategy == DynamicEmbScoreStrategy.CUSTOMIZED.value
        return args.check_scores(scores, keys, customized, self.score_strategy, self.device)

    def _check_values(self, values, keys) -> torch.Tensor:
        return args.check_values(
            values, keys, self.dim, self._layout.row_width, self.value_dtype, self.device
        )


def _subset(t: torch.Tensor | None, positions: torch.Tensor) -> torch.Tensor | None:
    return None if t is None else t[positions].contiguous()


__all__: Sequence[str] = ["ScoredHashTable", "BatchStats"]
