"""Typed wrappers over ``torch.ops.dynemb.*``: the one Python path to C++ (the embedding
ops' wrappers live in _embedding_ops.py and the executor's choice in _executor.py;
this module re-exports both, and the rest of dynemb imports only it).

The dispatcher picks the device implementation (CPU always; CUDA in CUDA builds),
so nothing here branches on the device. The positional lists the ops take (a
table's tensors, ``Policy``, ``Init``, ``OptimizerArgs``) are named once, in
``csrc/torch/op_lists.h``; ``OP_LISTS`` holds their field names as C++ exports them,
which the named tuples here and ``TableStorage.tensors()`` follow
(tests/csrc/test_op_lists.py).

``DYNEMB_EXECUTOR`` (read once, at import) chooses who runs the table and embedding
ops: ``cpu`` or ``cuda`` (the default: the tensors' device decides) or
``cuda-emulated``: the CUDA executor's kernels built for the host and run on CPU
threads, over CPU tensors (the op library ``torch.ops.dynemb_cuda_emulated``).
"""

import enum
from collections.abc import Sequence
from typing import NamedTuple

import torch

import dynemb._C as _C  # loads the op libraries into torch.ops
from dynemb import _fake_kernels
from dynemb._embedding_ops import (  # noqa: F401 - re-exported
    embedding_backward,
    embedding_backward_grouped,
    embedding_gather,
    embedding_gather_quantized,
    embedding_pool,
    embedding_pool_into,
    embedding_pool_into_grouped,
    embedding_pool_quantized,
    unique_keys,
    unique_keys_grouped,
    unique_keys_grouped_padded,
)
from dynemb._executor import (  # noqa: F401 - re-exported: _ops is the one path to C++
    EXECUTORS,
    _dynemb,
    _host,
    emulation_accesses,
    emulation_count_accesses,
    emulation_counters,
    executor,
)

_fake_kernels.register()  # shapes of the lookup ops for torch.export (no data needed)


# The op contract's codes, read from csrc/core (csrc/torch/core_constants.h); nothing
# here restates them. The public enums (dynemb.types) are checked against them by
# tests/csrc/test_core_constants.py.
_CORE = _C.constants
SCORE_STRATEGY_CODES: dict[str, int] = dict(_CORE["score_strategies"])  # core ScoreStrategy
INIT_MODE_CODES: dict[str, int] = dict(_CORE["init_modes"])  # core InitMode
POOLING_CODES: dict[str, int] = dict(_CORE["pooling_modes"])  # core PoolingMode
ROW_FORMAT_CODES: dict[str, int] = dict(_CORE["row_formats"])  # core RowFormat (8-bit rows)
OPTIMIZER_CODES: dict[str, int] = dict(_CORE["optimizers"])  # core OptimizerKind
# strategy code -> "clock" | "step" | "batch_number" | "unused" (core batch_value_source)
BATCH_VALUE_SOURCES: dict[int, str] = dict(_CORE["batch_value_sources"])
MAX_PROBE_BUCKETS: int = _CORE["max_probe_buckets"]  # core/table_ref.h kMaxProbeBuckets
# The bucket flag (in table.overflow) that a slot was erased (core/bucket.h "Holes").
HOLED_FLAG: int = _CORE["holed_flag"]
SECOND_BUCKET_SPAN: int = _CORE["second_bucket_span"]  # core/hash.h kSecondBucketSpan
MAX_SCORE: int = _CORE["max_score"]  # core/score_policy.h kMaxScore: counts saturate there
EVICT_ANY: int = _CORE["evict_any"]  # policy evict_below: any resident (0: never evict)
# policy pin_floor under which no resident is pinned; pin numbers are below it
# (core/table_ops.h "Pins", dynemb/table/pin_ledger.py).
NO_PINS: int = _CORE["no_pins"]
# policy strategy of a cache tier's claims: ScoreStrategy::kCache (internal; the
# public strategies are dynemb.DynamicEmbScoreStrategy).
CACHE_SCORES: int = SCORE_STRATEGY_CODES["CACHE"]
# the bits of a cache tier's score that hold its latest batch (core kCacheBatchMask)
CACHE_BATCH_MASK: int = _CORE["cache_batch_mask"]
TIMESTAMP_LFU: int = SCORE_STRATEGY_CODES["TIMESTAMP_LFU"]  # the (TIMESTAMP, LFU) compound
# DECAYED_LFU and its (TIMESTAMP, DECAYED_LFU) compound (core/decay.h): scores count steps
# in units of 2**-DECAY_FRACTION_BITS; the policy carries the half-life and the step.
DECAYED_LFU: int = SCORE_STRATEGY_CODES["DECAYED_LFU"]
TIMESTAMP_DECAYED_LFU: int = SCORE_STRATEGY_CODES["TIMESTAMP_DECAYED_LFU"]
DECAY_FRACTION_BITS: int = _CORE["decay_fraction_bits"]
MAX_HALF_LIFE: int = _CORE["max_half_life"]  # steps
MAX_DECAY_STEP: int = _CORE["max_decay_step"]  # the largest step a decayed score takes

Status = enum.IntEnum("Status", dict(_CORE["statuses"]))
Status.__doc__ = "Per-key outcome of an upsert (core/macros.h ``dynemb::Status``)."
STATUS_COUNT: int = _CORE["status_count"]


def batch_value(strategy_code: int, step: int, clock) -> int:
    """A training batch's ``policy.batch_value`` under a strategy (the rule of
    core/score_policy.h batch_value_source): ``clock()`` for TIMESTAMP scores, ``step``
    for STEP, else 0 (a cache tier passes its batch number itself)."""
    source = BATCH_VALUE_SOURCES[strategy_code]
    if source == "clock":
        return int(clock())
    return step if source == "step" else 0


def state_columns(optimizer_code: int, dim: int) -> int:
    """Optimizer-state columns per row of width ``dim`` (core/optimizer_rules.h)."""
    return _C.state_columns(optimizer_code, dim)


def spill_window(strategy_code: int, num_buckets: int) -> int:
    """Buckets a key may occupy (core/table_ops.h window_of): 1 for evicting strategies
    and tables of one bucket, else MAX_PROBE_BUCKETS (its home and its second bucket,
    one of the SECOND_BUCKET_SPAN after its home)."""
    return _C.spill_window(strategy_code, num_buckets)


OP_LISTS: dict[str, tuple[str, ...]] = {k: tuple(v) for k, v in _CORE["op_lists"].items()}
"""Field names of each positional op list, in order: ``table``, ``policy``, ``init``,
``optimizer`` (csrc/torch/op_lists.h)."""
TABLE_TENSORS: tuple[str, ...] = OP_LISTS["table"]
"""The op argument ``table``: these buffers of a table, in this order."""


class Policy(NamedTuple):
    """The op argument ``policy`` of upserts (csrc/torch/op_lists.h op_list::Policy)."""

    strategy: int  # a SCORE_STRATEGY_CODES value
    batch_value: int  # the batch's timestamp or step (csrc/core/score_policy.h)
    seed: int  # the initializer's seed
    evict_below: int  # EVICT_ANY: any resident may be evicted; 0: none
    dim: int  # columns the op initialises / writes
    pin: int = 0  # written to the pin of every slot the batch finds or claims
    pin_floor: int = NO_PINS  # residents pinned at or above it are not evicted
    half_life: int = 0  # DECAYED_LFU strategies: the half-life in steps, else 0
    decay_step: int = 0  # DECAYED_LFU strategies: the batch's step, else 0


class Init(NamedTuple):
    """The op argument ``init`` (and ``missing``) of ops that write new rows
    (csrc/torch/op_lists.h op_list::Init); the op takes it as a float list."""

    mode: float  # an INIT_MODE_CODES value
    a: float  # UNIFORM: lower bound; NORMAL: mean; CONSTANT: the value
    b: float  # UNIFORM: upper bound; NORMAL: std_dev
    lower: float  # the truncation bounds
    upper: float
    extra_value: float = 0.0  # the extra (optimizer-state) columns of a new row
    column_offset: float = 0.0  # the first column of a wider row the table holds
    extra_zeros: float = 0.0  # the first extra columns start at 0, not extra_value


class OptimizerArgs(NamedTuple):
    """The op argument ``optimizer`` of backward ops (csrc/torch/op_lists.h
    op_list::Optimizer)."""

    kind: float  # an OPTIMIZER_CODES value
    learning_rate: float
    eps: float
    beta1: float
    beta2: float
    weight_decay: float
    learning_rate_power: float = -0.5  # FTRL
    ftrl_beta: float = 0.0  # FTRL
    l1_reg: float = 0.0  # FTRL
    l2_reg: float = 0.0  # FTRL
    stochastic_rounding: float = 0.0  # 1: 16-bit rows round stochastically, 0: to nearest
    rounding_seed: float = 0.0  # the rounding bits' seed (a whole number below 2**53)


class UpsertResult(NamedTuple):
    status: torch.Tensor  # (n,) int8, a Status per key
    counts: torch.Tensor  # (4,) int64, keys per Status


def scores_after_hit(
    scores: torch.Tensor,
    strategy: int,
    batch_value: int,
    accesses: torch.Tensor | None = None,
    custom: torch.Tensor | None = None,
    half_life: int = 0,
    decay_step: int = 0,
) -> torch.Tensor:
    """Each score after a hit by a batch (core/score_policy.h ``score_after_tier_hit``):
    a cache tier keeps its rows' scores under the table's strategy with it. A score of 0
    gives a new key's score. ``accesses``: (n,) counts (LFU; None: 1 each);
    ``custom``: (n,) scores, required under CUSTOMIZED; ``half_life`` and
    ``decay_step`` (the batch's step): DECAYED_LFU's, required by it only."""
    return _dynemb.scores_after_hit(
        scores, strategy, batch_value, accesses, custom, half_life, decay_step
    )


def hash_keys(keys: torch.Tensor, num_buckets: int) -> tuple:
    """Hashes keys to buckets and slot digests.

    Args:
        keys: (n,) int64, contiguous.
        num_buckets: number of buckets, in [1, 2**32].

    Returns:
        ``(bucket, digest)``: (n,) int64 in [0, num_buckets) and (n,) uint8 in [1, 255].
    """
    return _dynemb.hash_keys(keys, num_buckets)


def table_find(
    table: Sequence[torch.Tensor], keys: torch.Tensor, values: torch.Tensor
) -> torch.Tensor:
    """Copies the first ``values.shape[1]`` columns of each found key's row into ``values``.

    Returns found: (n,) bool. Rows of absent keys are left untouched.
    """
    return _dynemb.table_find(list(table), keys, values)


def table_find_slots(table: Sequence[torch.Tensor], keys: torch.Tensor) -> torch.Tensor:
    """Returns slots: (n,) int64, the slot of each key or -1."""
    return _dynemb.table_find_slots(list(table), keys)


def table_find_or_insert(
    table: Sequence[torch.Tensor],
    policy: Policy,
    init: list[float],
    keys: torch.Tensor,
    scores: torch.Tensor | None,
    values: torch.Tensor,
    evicted: Sequence[torch.Tensor] = (),
) -> UpsertResult:
    """Finds each key or stores it with an initialised row; copies rows into ``values``.

    ``policy``: a ``Policy`` (its decay fields: DECAYED_LFU strategies only): a
    full bucket evicts its minimum resident only when that resident's score is
    ``< evict_below`` (``EVICT_ANY`` = -1: any resident; 0: never, the key fails) and
    its pin is ``< pin_floor`` (a key of a batch in flight is never evicted; every key
    the batch finds or stores gets pin ``pin``), stored keys are touched before new
    ones are placed (evicting strategies), ``init``: an ``Init``,
    ``evicted = []`` or ``[keys (n,), rows (n, row_width), scores (n,)]`` filled at the
    positions whose status is EVICTED.
    """
    return UpsertResult(
        *_dynemb.table_find_or_insert(
            list(table), list(policy), init, keys, scores, values, list(evicted)
        )
    )


def table_insert_or_assign(
    table: Sequence[torch.Tensor],
    policy: Policy,
    init: list[float],
    keys: torch.Tensor,
    scores: torch.Tensor | None,
    values: torch.Tensor,
    evicted: Sequence[torch.Tensor] = (),
) -> UpsertResult:
    """Stores ``values`` (n, dim or row_width) for each key; arguments as table_find_or_insert."""
    return UpsertResult(
        *_dynemb.table_insert_or_assign(
            list(table), list(policy), init, keys, scores, values, list(evicted)
        )
    )


def table_restore(
    table: Sequence[torch.Tensor],
    policy: Policy,
    init: list[float],
    keys: torch.Tensor,
    values: torch.Tensor,
    state: torch.Tensor | None,
    scores: torch.Tensor | None,
    timestamps: torch.Tensor | None,
    evicted: Sequence[torch.Tensor] = (),
) -> UpsertResult:
    """Stores saved entries exactly, as a checkpoint holds them (core/batch_sinks.h RestoreSink).

    Args:
        values: (n, dim) embedding columns, ``dim = policy.dim``.
        state: (n, row_width - dim) optimizer state, or None (a new key's state
            columns get ``init[5]``).
        scores: (n,) int64 scores to store (tables that keep scores), or None.
        timestamps: (n,) int64 last-access times ((TIMESTAMP, LFU) tables), or None.

    Placement, eviction and growth failures are those of table_insert_or_assign
    (under CUSTOMIZED a newcomer is admitted by its saved score); ``evicted`` as
    there. With ``dim = row_width`` (``policy.dim``) ``values`` are whole rows.
    Returns the UpsertResult.
    """
    return UpsertResult(
        *_dynemb.table_restore(
            list(table), list(policy), init, keys, values, state, scores, timestamps, list(evicted)
        )
    )


def crc32(data: torch.Tensor, crc: int = 0) -> int:
    """CRC-32 of ``data`` ((n,) uint8, contiguous, CPU) continued from ``crc``: zlib.crc32's value.

    Runs without the GIL at several GB/s (carry-less multiply folding where the CPU has it).
    """
    return _host.crc32(data, crc)


def table_erase(table: Sequence[torch.Tensor], keys: torch.Tensor) -> torch.Tensor:
    """Removes keys. Returns erased: (n,) bool, True where the key was stored."""
    return _dynemb.table_erase(list(table), keys)


def table_rehash(src: Sequence[torch.Tensor], dst: Sequence[torch.Tensor], window: int) -> int:
    """Moves every entry of ``src`` into the empty ``dst``. Returns entries that did not fit."""
    return _dynemb.table_rehash(list(src), list(dst), window)


def set_thread_limit(n: int) -> int:
    """Limits the CPU threads of the ops (dynemb's and torch's) that the calling
    thread runs to ``n``; other threads keep theirs. Returns the previous limit."""
    return _host.set_thread_limit(n)


def advise_huge_pages(buffer: torch.Tensor) -> bool:
    """Asks for transparent huge pages under an untouched host buffer (no-op elsewhere).

    Returns True when the kernel accepted the advice.
    """
    if buffer.device.type != "cpu":
        return False
    return _host.advise_huge_pages(buffer)


def table_find_or_insert_slots(
    table: Sequence[torch.Tensor],
    policy: Policy,
    init: list[float],
    keys: torch.Tensor,
    scores: torch.Tensor | None,
    accesses: torch.Tensor | None = None,
    init_rows: bool = True,
    evicted_keys: torch.Tensor | None = None,
    live: torch.Tensor | None = None,
) -> tuple:
    """find_or_insert that records slots instead of copying rows.

    ``accesses`` (n,) int64: how many accesses each key stands for (LFU adds them;
    a de-duplicated batch passes its counts). ``init_rows=False`` leaves a new
    key's slot with the row it had (an evicted resident's): the caller moves that
    row out and writes the new one (a cache fill). ``evicted_keys`` (n,) int64 gets,
    at each EVICTED position, the key that left the slot. ``live`` (1,) int64 on the
    table's device: only the first ``live`` keys are looked up (a padded batch, see
    ``unique_keys_grouped_padded``); the slots and status past them are not written
    and the counts omit them. Returns ``(slots (n,) int64 (-1: not stored), status
    (n,) int8, counts (4,) int64)``.
    """
    return _dynemb.table_find_or_insert_slots(
        list(table), list(policy), init, keys, scores, accesses, init_rows, evicted_keys, live
    )


def table_find_or_insert_slots_grouped(
    tables: Sequence[Sequence[torch.Tensor]],
    policies: Sequence[Policy],
    inits: Sequence[list[float]],
    keys: Sequence[torch.Tensor],
    accesses: Sequence[torch.Tensor] | None = None,
    distinct_keys: bool = False,
) -> tuple:
    """``table_find_or_insert_slots`` (rows initialised, no evicted keys) of each table
    in one op call: table t's buffers, policy, init list, keys and (optionally)
    accesses. Each table's result is the per-table op's; every argument is checked
    before any table changes, and a table may appear once.
    ``distinct_keys``: the caller's promise that each table's keys are pairwise distinct
    (a de-duplicated batch), which spares new keys a second probe (an evicting table's
    go straight to the victim search, a NO_EVICTION table's to a free slot of the bucket
    the batch rule's pass 0 chose); a repeated key would be stored twice.
    Returns ``(slots, status, counts)``: lists of one (n_t,) tensor per table, and
    counts (T, 4) int64 (one read of it serves every table)."""
    keys = list(keys)
    if not keys:
        raise ValueError("table_find_or_insert_slots_grouped needs at least one table, got none")
    return _dynemb.table_find_or_insert_slots_grouped(
        [x for table in tables for x in table], [v for p in policies for v in p],
        [v for init in inits for v in init], keys, list(accesses or []), distinct_keys,
    )  # fmt: skip


def table_cache_exchange(
    cache: Sequence[torch.Tensor],
    slow: Sequence[torch.Tensor],
    init: list[float],
    seed: int,
    dim: int,
    user_scores: torch.Tensor,
    keys: torch.Tensor,
    slots: torch.Tensor,
    status: torch.Tensor,
    evicted_keys: torch.Tensor,
    moved: int = -1,
    victims: int = -1,
) -> tuple:
    """A cache fill's row moves (core/tier_ops.h), after its slot claim.

    ``keys``, ``slots``, ``status`` and ``evicted_keys`` are the claim's (n,) arrays
    (``table_find_or_insert_slots``). For each key whose status is INSERTED or
    EVICTED: where EVICTED, the resident ``evicted_keys[i]`` leaves with the slot's
    row and its entry of ``user_scores`` (one int64 per cache slot); then the slot
    gets the key's row and score in ``slow`` (a table of the same row layout) or, if
    ``slow`` lacks it, the initial row of ``init``/``seed`` (``dim`` columns, the
    rest at the extra value) and score 0. Hits and failed keys are left alone.
    Returns ``(victim_keys (v,), victim_rows (v, row_width), victim_scores (v,),
    found (n,) bool)``, the victims in the order of their keys.

    ``moved`` and ``victims``: the claim's counts of the keys that take a slot
    (INSERTED + EVICTED) and of those that evict a resident (EVICTED), when the caller
    has them: a CUDA executor then sizes its outputs by them without reading the
    device (its own counts still bound every read and write); the CPU executor checks
    them (ValueError where they are not the counts of ``status``). -1: counted here.
    """
    return _dynemb.table_cache_exchange(
        list(cache), list(slow), init, seed, dim, user_scores, keys, slots, status,
        evicted_keys, moved, victims,
    )  # fmt: skip
