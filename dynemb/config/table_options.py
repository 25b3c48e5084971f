"""Option dataclasses of the public API, with validation (names mirror DynamicEmb;
``dynemb.dynamicemb_config`` re-exports them with the enums, sizing helpers and
converters ``dynamicemb.dynamicemb_config`` names)."""

import dataclasses
import math
import numbers
import warnings
from typing import Any

import torch

from dynemb import _ops
from dynemb.config.score_strategies import (
    ScoreStrategy,
    check_score_half_life,
    normalize_score_strategy,
    resolved_evict_strategy,
)
from dynemb.config.types import (
    DynamicEmbCheckMode,
    DynamicEmbEvictStrategy,
    DynamicEmbInitializerMode,
    DynamicEmbScoreStrategy,
)

__all__ = [
    "BATCH_SIZE_PER_DUMP",
    "DEFAULT_BUCKET_CAPACITY",
    "DIST_TYPES",
    "FLOAT32_MAX",
    "SUPPORTED_DIST_TYPES",
    "DynamicEmbInitializerArgs",
    "DynamicEmbTableOptions",
    "check_float32",
    "dtype_to_bytes",
    "init_mode_code",
    "with_kernel_defaults",
]

BATCH_SIZE_PER_DUMP = 65536
"""Rows DynamicEmb's checkpoint code handles at once (dynemb streams chunks of this size)."""

DEFAULT_BUCKET_CAPACITY = 128
"""``DynamicEmbTableOptions.bucket_capacity``'s default: slots per bucket."""


def dtype_to_bytes(dtype: torch.dtype) -> int:
    """Bytes of one element of ``dtype`` (``torch.bfloat16`` -> 2).

    Raises:
        TypeError: ``dtype`` is not a ``torch.dtype``.
    """
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"dtype_to_bytes: `dtype` must be a torch.dtype, got {dtype!r}")
    return dtype.itemsize


# DynamicEmbInitializerMode -> InitMode code of csrc/core/initializer.h.
_INIT_MODE_CODE = {mode: _ops.INIT_MODE_CODES[mode.name] for mode in DynamicEmbInitializerMode}


_MODE_FIELDS = {
    DynamicEmbInitializerMode.NORMAL: ("mean", "std_dev"),
    DynamicEmbInitializerMode.TRUNCATED_NORMAL: ("mean", "std_dev", "lower", "upper"),
    DynamicEmbInitializerMode.UNIFORM: ("lower", "upper"),
    DynamicEmbInitializerMode.CONSTANT: ("value",),
    DynamicEmbInitializerMode.DEBUG: (),
}


FLOAT32_MAX = float(torch.finfo(torch.float32).max)


def check_float32(name: str, value) -> None:
    """Raises ValueError naming ``name`` unless ``value`` is a finite number that float32
    represents (rows and optimizer state are computed in float32: a larger value
    would become inf, then NaN rows)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    exact = int(value) if isinstance(value, numbers.Integral) else float(value)
    if not abs(exact) <= FLOAT32_MAX:  # also NaN, and ints too large for a float
        raise ValueError(
            f"{name} must be a finite number representable in float32 "
            f"(|value| <= {FLOAT32_MAX:.7g}), got {value!r}"
        )


def _float32_difference(a: float, b: float) -> float:
    """``a - b`` computed as the ops compute it: both rounded to float32, then subtracted
    in float32 (``inf`` when the difference overflows)."""
    pair = torch.tensor([a, b], dtype=torch.float32)
    return float(pair[0] - pair[1])


def init_mode_code(mode: DynamicEmbInitializerMode) -> int:
    """The op code (``InitMode`` of csrc/core/initializer.h) of an initializer mode."""
    return _INIT_MODE_CODE[mode]


@dataclasses.dataclass
class DynamicEmbInitializerArgs:
    """How new embedding rows are initialised.

    Args:
        mode: the distribution (default UNIFORM).
        mean: NORMAL / TRUNCATED_NORMAL mean.
        std_dev: NORMAL / TRUNCATED_NORMAL standard deviation (> 0).
        lower: UNIFORM lower bound / TRUNCATED_NORMAL lower cut. ``None``: for UNIFORM,
            ``-sqrt(1 / capacity)`` of the table it initialises (the planner fills it
            from ``num_embeddings``); for TRUNCATED_NORMAL, ``mean - 2 * std_dev``.
        upper: the matching upper bound (``None``: ``+sqrt(1 / capacity)``, or
            ``mean + 2 * std_dev``). For UNIFORM, ``upper - lower`` must be a finite
            float32 number too.
        value: CONSTANT value.

    Example::

        DynamicEmbInitializerArgs(mode=DynamicEmbInitializerMode.NORMAL, std_dev=0.01)
    """

    mode: DynamicEmbInitializerMode = DynamicEmbInitializerMode.UNIFORM
    mean: float = 0.0
    std_dev: float = 1.0
    lower: float | None = None
    upper: float | None = None
    value: float = 0.0

    def __eq__(self, other: object) -> bool:
        """Same mode and the same values of the fields that mode reads (NORMAL: mean,
        std_dev; TRUNCATED_NORMAL: those and lower, upper; UNIFORM: lower, upper;
        CONSTANT: value; DEBUG: none)."""
        if not isinstance(other, DynamicEmbInitializerArgs):
            return NotImplemented
        fields = _MODE_FIELDS.get(self.mode, ())
        return self.mode == other.mode and all(
            getattr(self, f) == getattr(other, f) for f in fields
        )

    def validate(self) -> None:
        """Raises TypeError / ValueError naming the offending field."""
        if not isinstance(self.mode, DynamicEmbInitializerMode):
            raise TypeError(
                f"DynamicEmbInitializerArgs.mode must be a DynamicEmbInitializerMode, got {self.mode!r}"
            )
        for name in ("mean", "std_dev", "value", "lower", "upper"):
            v = getattr(self, name)
            if v is not None or name not in ("lower", "upper"):
                check_float32(f"DynamicEmbInitializerArgs.{name}", v)
        if self.mode in (
            DynamicEmbInitializerMode.NORMAL,
            DynamicEmbInitializerMode.TRUNCATED_NORMAL,
        ):
            if self.std_dev <= 0:
                raise ValueError(
                    f"DynamicEmbInitializerArgs.std_dev must be > 0, got {self.std_dev}"
                )
        if self.lower is not None and self.upper is not None and not self.lower < self.upper:
            raise ValueError(
                f"DynamicEmbInitializerArgs needs lower < upper, got lower={self.lower}, upper={self.upper}"
            )
        if self.mode == DynamicEmbInitializerMode.UNIFORM:
            # Rows are drawn as lower + (upper - lower) * u in float32; the default bounds
            # are widest for capacity 1 (-+1).
            _, _, _, lo, hi = self.resolved(1)
            span = _float32_difference(hi, lo)
            if not math.isfinite(span):
                raise ValueError(
                    "DynamicEmbInitializerArgs.upper - lower must be a finite float32 number "
                    f"(<= {FLOAT32_MAX:.7g}: UNIFORM draws lower + (upper - lower) * u), got "
                    f"{span} for lower={lo!r}, upper={hi!r}; narrow the bounds"
                )
        if self.mode == DynamicEmbInitializerMode.TRUNCATED_NORMAL:
            # The default cuts mean -+ 2 * std_dev must be float32 numbers too.
            _, _, _, lo, hi = self.resolved(1)
            check_float32("DynamicEmbInitializerArgs lower cut (mean - 2 * std_dev)", lo)
            check_float32("DynamicEmbInitializerArgs upper cut (mean + 2 * std_dev)", hi)

    def resolved(self, capacity: int) -> tuple:
        """The op's ``init`` list ``[mode, a, b, lower, upper]`` for a table of ``capacity`` rows."""
        mode = self.mode
        code = init_mode_code(mode)
        if mode == DynamicEmbInitializerMode.UNIFORM:
            bound = math.sqrt(1.0 / max(1, capacity))
            lo = -bound if self.lower is None else self.lower
            hi = bound if self.upper is None else self.upper
            return (code, lo, hi, lo, hi)
        if mode in (DynamicEmbInitializerMode.NORMAL, DynamicEmbInitializerMode.TRUNCATED_NORMAL):
            lo = self.mean - 2 * self.std_dev if self.lower is None else self.lower
            hi = self.mean + 2 * self.std_dev if self.upper is None else self.upper
            return (code, self.mean, self.std_dev, lo, hi)
        if mode == DynamicEmbInitializerMode.CONSTANT:
            return (code, self.value, 0.0, 0.0, 0.0)
        return (code, 0.0, 0.0, 0.0, 0.0)


def _zeros() -> DynamicEmbInitializerArgs:
    return DynamicEmbInitializerArgs(mode=DynamicEmbInitializerMode.CONSTANT, value=0.0)


@dataclasses.dataclass(eq=False)
class DynamicEmbTableOptions:
    """Options of one dynamic table. Fields, their order and defaults mirror DynamicEmb;
    ``seed`` and ``spill_directory`` are dynemb additions (last, keyword use).

    Args:
        embedding_dtype: row storage: float32, float16 or bfloat16 (``None``: the
            planner takes the TorchRec config's ``data_type``; float32 without planner).
        dim: embedding width (``None``: taken from the TorchRec config by the planner).
        max_capacity: maximum rows on this rank (``None``: filled by the planner).
        evict_strategy: DynamicEmb's eviction name. In dynemb (as in DynamicEmb's
            kernel) ``score_strategy`` decides the eviction; the planner and the TBE module
            set this field to the strategy it implies (``evict_strategy_of``), with a
            ``UserWarning`` when a non-default value disagreed.
        local_hbm_for_values: bytes of value rows (with optimizer state) in the fast
            tier on this rank (the planner fills it from ``global_hbm_for_values``). 0:
            no budget, every row is fast. Below the table's value bytes and without
            ``caching``, the table is hybrid (on a CPU both tiers are host memory).
        device_id: the CUDA device index of the table (``None``: the current device);
            ignored on CPU.
        training: False makes the table read-only (lookups never insert).
        initializer_args: rows of new keys in training.
        eval_initializer_args: rows of unknown keys in eval mode (zeros by default).
        caching: the fast tier is a cache in front of a slow tier holding every row.
        init_capacity: initial rows (``None``: ``max_capacity``); the table grows up
            to ``max_capacity`` before it evicts (x2 a step; x1.3 under NO_EVICTION).
        max_load_factor: accepted for DynamicEmb compatibility (a float); dynemb's
            tables grow when a key finds its buckets full, not at a load factor (see
            "Differences from DynamicEmb" in docs/dynamicemb.md).
        score_strategy: eviction score (see DynamicEmbScoreStrategy), or a compound
            ``(TIMESTAMP, LFU)`` / ``(TIMESTAMP, DECAYED_LFU)``; a 1-tuple is unwrapped.
        bucket_capacity: slots per bucket (multiple of 16).
        safe_check_mode: what a training lookup does with keys that could not be
            stored (ERROR raises, WARNING warns, IGNORE is silent; both give zero rows).
        global_hbm_for_values: bytes of the fast tier over all ranks.
        external_storage: with ``caching``: a Storage class used as the slow tier.
        index_type: key dtype (``None`` or ``torch.int64``).
        dist_type: routing of keys to ranks: "continuous", "roundrobin" or
            "hash_roundrobin".
        admit_strategy: admission of new keys (see dynemb.admission_strategies), e.g.
            ``FrequencyAdmissionStrategy(threshold, counter=KVCounter(capacity))``.
        admission_counter: deprecated (as in DynamicEmb): the counter now goes on the
            strategy. Given here it warns (DeprecationWarning) and, when the strategy
            is a FrequencyAdmissionStrategy without a counter, is folded into a copy
            of it (the caller's strategy is unchanged; a strategy with a counter of
            its own keeps it); the field is then None. Without a strategy (or with one
            that takes no counter) the field stays: the table counts with it, and
            without a strategy admits every key.
        seed: (dynemb) initializer seed (rows are a function of (seed, key)).
        stochastic_rounding: (dynemb) a float16 / bfloat16 table stores each optimizer
            result (weights and state) rounded stochastically rather than to nearest:
            random bits of (seed, key, column, step) below the kept mantissa, then
            truncation, so small updates do not vanish and the stored value is right in
            expectation; the same bits on every executor, in a replay and after a
            restart. Off by default; no effect on float32 tables.
        spill_directory: (dynemb) keep each table's slot buffers and slow-tier rows in
            memory-mapped files under ``<spill_directory>/<table>.rank<r>``.
        score_half_life_steps: (dynemb) DECAYED_LFU's half-life: the training steps
            after which an access weighs half. Required by DECAYED_LFU, refused otherwise.
        column_offset: (dynemb) the table holds columns ``[column_offset,
            column_offset + dim)`` of a wider table's rows, and its new rows are those
            columns of the rows the whole table would start with. The column-wise
            sharding sets it on each slice; 0 otherwise.
        eviction_rule: (dynemb) an ``EvictionRule`` (dynemb.eviction_rules): the keys
            it says are stale are erased on a schedule (its ``every_n_steps`` /
            ``load_factor_above``, ``buckets_per_step`` buckets per training forward)
            and by ``erase_stale()``; None: a table evicts only when a bucket is full.
        block_size, io_block_size, io_by_cpu, use_constant_memory,
            reserved_key_start_bit, num_of_buckets_per_alloc: DynamicEmb's
            HierarchicalKV tuning fields, which DynamicEmb asks users to ignore;
            accepted, no effect.
        warm_start: (dynemb) a ``dynemb.warm_start.WarmStart`` source: a key a training
            lookup inserts takes its first row (and its optimizer state, when the
            source keeps one of the table's width) from it instead of the initializer
            (None: the initializer's). See "Warm start" in DynamicEmb_APIs.md.
        hot_replicas: (dynemb) row-wise sharding: up to this many of the table's most
            accessed keys are copied to every rank, which then looks them up locally
            instead of through the all-to-all (``dynemb.shard.hot_keys``); training is
            unchanged (the copies take the same summed gradient and update as the
            owner's row, which stays the table's). 0: none.
        hot_refresh_steps: (dynemb) the hot set is chosen again every this many
            training steps, from the accesses of every rank since the last choice.

    Raises:
        ValueError: an unknown ``dist_type``; ``hot_replicas`` < 0 or
            ``hot_refresh_steps`` < 1 (or not ints); ``score_half_life_steps`` missing, out of
            [1, 2**31 - 1] or given to a strategy that does not decay.
        NotImplementedError: a ``score_strategy`` tuple other than the compounds.
        TypeError: a ``score_strategy`` that is not a DynamicEmbScoreStrategy.

    Equality and hash (DynamicEmb's grouping key) use ``training``, ``caching``,
    ``external_storage``, ``index_type``, ``dist_type``, ``score_strategy`` and
    ``admit_strategy``.

    Example::

        DynamicEmbTableOptions(dim=64, max_capacity=1 << 20,
                               score_strategy=DynamicEmbScoreStrategy.LFU)
    """

    embedding_dtype: torch.dtype | None = None
    dim: int | None = None
    max_capacity: int | None = None
    evict_strategy: DynamicEmbEvictStrategy = DynamicEmbEvictStrategy.LRU
    local_hbm_for_values: int = 0
    device_id: int | None = None
    training: bool = True
    initializer_args: DynamicEmbInitializerArgs = dataclasses.field(
        default_factory=DynamicEmbInitializerArgs
    )
    eval_initializer_args: DynamicEmbInitializerArgs = dataclasses.field(default_factory=_zeros)
    caching: bool = False
    init_capacity: int | None = None
    max_load_factor: float = 0.5
    score_strategy: ScoreStrategy | None = DynamicEmbScoreStrategy.TIMESTAMP
    bucket_capacity: int = 128
    safe_check_mode: DynamicEmbCheckMode = DynamicEmbCheckMode.IGNORE
    global_hbm_for_values: int = 0
    external_storage: Any | None = None
    index_type: torch.dtype | None = None
    dist_type: str = "roundrobin"
    admit_strategy: Any | None = None
    admission_counter: Any | None = None
    seed: int = 0
    spill_directory: str | None = None
    score_half_life_steps: int | None = None
    column_offset: int = 0
    warm_start: Any | None = None
    eviction_rule: Any | None = None
    stochastic_rounding: bool = False
    hot_replicas: int = 0
    hot_refresh_steps: int = 100
    # DynamicEmb's HierarchicalKV tuning fields ("will be removed, please ignore them"
    # in DynamicEmb): accepted so that code setting them runs; no effect in dynemb.
    block_size: int = 128
    io_block_size: int = 1024
    io_by_cpu: bool = False
    use_constant_memory: bool = False
    reserved_key_start_bit: int = 0
    num_of_buckets_per_alloc: int = 1

    def __post_init__(self) -> None:
        for field, low in (("hot_replicas", 0), ("hot_refresh_steps", 1)):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(
                    f"DynamicEmbTableOptions.{field} must be an int >= {low}, got {value!r}"
                )
        if self.dist_type not in DIST_TYPES:
            raise ValueError(
                f"DynamicEmbTableOptions.dist_type must be one of {DIST_TYPES}, "
                f"got {self.dist_type!r}"
            )
        self.score_strategy = normalize_score_strategy(self.score_strategy)
        name = "DynamicEmbTableOptions.score_half_life_steps"
        check_score_half_life(self.score_strategy, self.score_half_life_steps, name)
        if self.admission_counter is not None:
            self._fold_admission_counter()

    def _fold_admission_counter(self) -> None:
        """DynamicEmb's deprecation of ``admission_counter``: warn, and give the counter
        to a copy of the strategy (a copy: one strategy often serves several tables,
        each with its own counter capacity). A strategy that cannot take one (no
        ``with_counter``) or has its own keeps its own; the table then reads the
        counter here (dynemb.tbe.table_options.admission_counter_of)."""
        strategy = self.admit_strategy
        fold = getattr(strategy, "with_counter", None)
        own = getattr(strategy, "counter", None)
        if own is not None:
            detail = f"the strategy's own counter {own!r} is used, this one is ignored"
        elif fold is not None:
            detail = "it is given to a copy of the strategy"
        else:
            detail = "the table counts with it"
        warnings.warn(
            "DynamicEmbTableOptions.admission_counter is deprecated: pass the counter to "
            "the strategy, FrequencyAdmissionStrategy(threshold, counter=KVCounter(...)); "
            f"{detail}",
            DeprecationWarning,
            stacklevel=4,
        )
        if fold is not None and own is None:
            self.admit_strategy = fold(self.admission_counter)
        if getattr(self.admit_strategy, "counter", None) is not None:
            # One place holds it: copies of these options (dataclasses.replace) neither
            # warn again nor fold twice.
            self.admission_counter = None

    def _key(self) -> tuple:
        return (
            self.training,
            self.caching,
            self.external_storage,
            self.index_type,
            self.dist_type,
            self.score_strategy,
            self.admit_strategy,
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, DynamicEmbTableOptions):
            return NotImplemented
        return self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())


DIST_TYPES = ("continuous", "roundrobin", "hash_roundrobin")
"""The ``dist_type`` values: how a sharded table routes raw keys to ranks."""

SUPPORTED_DIST_TYPES = DIST_TYPES
"""DynamicEmb's name of ``DIST_TYPES``."""


def hot_replica_rows(options: DynamicEmbTableOptions) -> int:
    """Slots a rank's replica of a table's hot keys allocates (``hot_replicas``): at
    most a quarter full, whole buckets; 0 without hot replicas."""
    k, bucket = options.hot_replicas, options.bucket_capacity
    return 0 if k == 0 else bucket * max(1, -(-4 * k // bucket))


def with_kernel_defaults(name: str, options: DynamicEmbTableOptions) -> DynamicEmbTableOptions:
    """A copy of ``options`` with the fields a table needs filled where they are ``None``
    (what the planner fills from the TorchRec config when there is one):
    ``embedding_dtype`` float32, ``index_type`` int64, ``score_strategy`` TIMESTAMP, and
    ``evict_strategy`` the one the score strategy implies."""
    score = options.score_strategy
    if score is None:
        score = DynamicEmbScoreStrategy.TIMESTAMP
    filled = dataclasses.replace(
        options,
        embedding_dtype=options.embedding_dtype or torch.float32,
        index_type=options.index_type or torch.int64,
        score_strategy=score,
    )
    filled.evict_strategy = resolved_evict_strategy(name, filled)
    return filled
