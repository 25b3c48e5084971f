"""Eviction by rule: erase the keys whose stored scores say they are stale.

A table evicts on its own only when a bucket is full. An ``EvictionRule`` erases keys
by a predicate on what the table keeps per key: last access older than S steps (STEP)
or T seconds of the table's clock (TIMESTAMP and the (TIMESTAMP, ...) compounds), an
access count below c (LFU, DECAYED_LFU and the compounds), a raw score below s (any
strategy that keeps scores, e.g. CUSTOMIZED), an embedding row's L2 norm below eps. A
key is erased when any predicate set says it is stale.

How it stays reproducible: the thresholds are computed once per pass, on the host,
from the table's own step and clock (``score_step``, ``now()``), and compared with the
stored int64 scores on the device (the norm: float64 of the stored row), so both
executors and a replay erase the same keys.

How it stays out of the way: a pass scans the table a bounded number of buckets at a
time (``buckets_per_step``), one chunk per training forward when scheduled (every
``every_n_steps`` table steps, or when the load factor passes ``load_factor_above``),
or all at once on demand (``erase_stale``). No key of a batch in flight is erased: its
slot's pin is at or above the table's pin floor (dynemb/table/pin_ledger.py), which
also holds the forwards awaiting their backward; in caching mode the cache's pins and
its staged keys say the same.

What it leaves: erased keys go through the table's erase, so a ``DeltaPublisher``'s
change log records them (tombstones in the next delta); ``ErasedKeys`` journals them
per table for incremental dumps, whose ``(keys, rows)`` shape cannot say that a key
left (``erased_since``); telemetry counts passes, buckets scanned and keys erased
(``TableTelemetry.rule_*``).
"""

import dataclasses
import math
from collections.abc import Sequence

import torch

from dynemb import _ops
from dynemb.config.types import DynamicEmbScoreStrategy
from dynemb.table_groups import public_collection_path, table_groups

__all__: Sequence[str] = [
    "EvictionRule",
    "RuleThresholds",
    "erase_stale",
    "erased_mark",
    "erased_since",
]

_STEP = DynamicEmbScoreStrategy.STEP.value
_TIMESTAMP = DynamicEmbScoreStrategy.TIMESTAMP.value
_LFU = DynamicEmbScoreStrategy.LFU.value
_CUSTOMIZED = DynamicEmbScoreStrategy.CUSTOMIZED.value
_NO_EVICTION = DynamicEmbScoreStrategy.NO_EVICTION.value
_COUNTS = (_LFU, _ops.TIMESTAMP_LFU)  # the score is a count
_DECAYED = (_ops.DECAYED_LFU, _ops.TIMESTAMP_DECAYED_LFU)  # the score is a decayed count
_LAST_ACCESS = {_TIMESTAMP: "scores", _ops.TIMESTAMP_LFU: "timestamps",
                _ops.TIMESTAMP_DECAYED_LFU: "timestamps"}  # fmt: skip


@dataclasses.dataclass(frozen=True)
class EvictionRule:
    """Which keys are stale, and when a table looks for them.

    Predicates (None: not used; at least one is required; a key is stale when any set
    one holds):

    Attributes:
        max_idle_steps: erase keys whose last access is more than this many table
            steps ago (``score_step - score > S``): STEP tables.
        max_idle_seconds: erase keys whose last access is more than this many seconds
            of the table's clock ago (``now() - last access > T * 1e9`` ns): TIMESTAMP
            and the (TIMESTAMP, LFU / DECAYED_LFU) compounds.
        min_count: erase keys counted fewer than this many times: LFU and (TIMESTAMP,
            LFU) (the stored count); DECAYED_LFU and (TIMESTAMP, DECAYED_LFU) (the
            decayed count at the table's step, ``decayed_count``).
        min_score: erase keys whose stored score is below this int: any strategy
            that keeps scores (CUSTOMIZED's own scores, say).
        min_norm: erase keys whose embedding row (the table's ``dim`` columns, in
            float64) has an L2 norm below this: any strategy.

    Schedule (for ``DynamicEmbTableOptions(eviction_rule=...)``; ``erase_stale`` on
    demand ignores it):

    Attributes:
        every_n_steps: start a pass each time the table's step passes a multiple of N.
        load_factor_above: start a pass when the load factor is above this (in (0, 1]).
        buckets_per_step: buckets a scheduled pass scans per training forward (>= 1),
            so that no step stalls; a pass ends when it has scanned every bucket.

    Raises:
        TypeError / ValueError (at construction): a bad value, named with it;
        ValueError (when a table takes it): a predicate its score strategy does not
        keep (``check``).

    Example::

        >>> rule = EvictionRule(max_idle_steps=1000, every_n_steps=500, buckets_per_step=8)
    """

    max_idle_steps: int | None = None
    max_idle_seconds: float | None = None
    min_count: float | None = None
    min_score: int | None = None
    min_norm: float | None = None
    every_n_steps: int | None = None
    load_factor_above: float | None = None
    buckets_per_step: int = 16

    def __post_init__(self) -> None:
        def check(name, value, kind, low, strict=False):
            if value is None:
                return
            if isinstance(value, bool) or not isinstance(value, kind):
                raise TypeError(
                    f"EvictionRule: {name} must be {kind.__name__ if isinstance(kind, type) else 'a number'}, got {value!r}"
                )
            if (value <= low) if strict else (value < low):
                raise ValueError(
                    f"EvictionRule: {name} must be {'>' if strict else '>='} {low}, got {value!r}"
                )

        number = (int, float)
        check("max_idle_steps", self.max_idle_steps, int, 0)
        check("max_idle_seconds", self.max_idle_seconds, number, 0)
        check("min_count", self.min_count, number, 0)
        check("min_score", self.min_score, int, -(2**63))
        check("min_norm", self.min_norm, number, 0)
        check("every_n_steps", self.every_n_steps, int, 1)
        check("load_factor_above", self.load_factor_above, number, 0, strict=True)
        check("buckets_per_step", self.buckets_per_step, int, 1)
        if self.load_factor_above is not None and self.load_factor_above > 1:
            raise ValueError(
                f"EvictionRule: load_factor_above must be in (0, 1], got {self.load_factor_above}"
            )
        if all(getattr(self, f) is None for f in _PREDICATES):
            raise ValueError(f"EvictionRule: set at least one of {', '.join(_PREDICATES)}")
        for name in ("max_idle_seconds", "min_count", "min_norm"):
            value = getattr(self, name)
            if value is not None and not math.isfinite(value):
                raise ValueError(f"EvictionRule: {name} must be finite, got {value!r}")

    @property
    def scheduled(self) -> bool:
        """Whether a table runs it on its own (``every_n_steps`` or ``load_factor_above``)."""
        return self.every_n_steps is not None or self.load_factor_above is not None

    def check(self, strategy_code: int, table: str = "") -> None:
        """Raises ValueError, naming the table and its strategy, for a predicate that
        the strategy of code ``strategy_code`` keeps nothing to decide on."""
        name = _strategy_name(strategy_code)
        where = f"table {table!r}: " if table else ""

        def refuse(field, needs):
            raise ValueError(
                f"{where}EvictionRule.{field}={getattr(self, field)!r} needs {needs}; "
                f"this table's score strategy is {name}"
            )

        if strategy_code == _NO_EVICTION:
            raise ValueError(
                f"{where}eviction by rule needs a table that keeps scores and pins "
                f"(every score strategy but NO_EVICTION); this table's is {name}"
            )
        if self.max_idle_steps is not None and strategy_code != _STEP:
            refuse("max_idle_steps", "a STEP table (its score is the step of the last access)")
        if self.max_idle_seconds is not None and strategy_code not in _LAST_ACCESS:
            refuse(
                "max_idle_seconds", "a last-access time: TIMESTAMP or a (TIMESTAMP, ...) compound"
            )
        if self.min_count is not None and strategy_code not in _COUNTS + _DECAYED:
            refuse("min_count", "a count: LFU, DECAYED_LFU or a (TIMESTAMP, ...) compound")


_PREDICATES = ("max_idle_steps", "max_idle_seconds", "min_count", "min_score", "min_norm")


def _strategy_name(code: int) -> str:
    for name, c in _ops.SCORE_STRATEGY_CODES.items():
        if c == code:
            return name
    return str(code)


@dataclasses.dataclass(frozen=True)
class RuleThresholds:
    """A rule's thresholds for one pass over one table, computed once on the host.

    Attributes:
        score_below: erase where the stored score is below it (steps, counts, decayed
            counts and raw scores all compare so; the largest applies), or None.
        last_access_below: erase where the last access (``column``) is below it, or None.
        column: where the last access is kept: "scores" (TIMESTAMP) or "timestamps".
        norm_below: erase where the row's L2 norm is below it, or None.
        step: the table step they were computed at; now: its clock then (ns).
    """

    score_below: int | None
    last_access_below: int | None
    column: str | None
    norm_below: float | None
    step: int
    now: int

    @staticmethod
    def of(rule: EvictionRule, strategy_code: int, step: int, now: int,
           half_life_steps: int | None = None) -> "RuleThresholds":  # fmt: skip
        """The thresholds of ``rule`` for a table of ``strategy_code`` at ``step`` and
        clock ``now`` (ns); ``half_life_steps`` for the decayed counts."""
        rule.check(strategy_code)
        below = []
        if rule.max_idle_steps is not None:
            below.append(step - rule.max_idle_steps)
        if rule.min_count is not None:
            if strategy_code in _DECAYED:
                # decayed count at `step` = 2 ** ((L / 2**16 - step) / H) < c
                #   <=> L < (step + H * log2(c)) * 2**16 (c <= 0: never)
                c = rule.min_count
                if c > 0:
                    level = (step + half_life_steps * math.log2(c)) * (
                        1 << _ops.DECAY_FRACTION_BITS
                    )
                    below.append(math.ceil(level))
            else:
                below.append(math.ceil(rule.min_count))  # int count < c <=> count < ceil(c)
        if rule.min_score is not None:
            below.append(rule.min_score)
        last = None
        if rule.max_idle_seconds is not None:
            last = now - math.ceil(rule.max_idle_seconds * 1e9)
        return RuleThresholds(
            score_below=max(below) if below else None,
            last_access_below=last,
            column=_LAST_ACCESS.get(strategy_code) if last is not None else None,
            norm_below=None if rule.min_norm is None else float(rule.min_norm),
            step=step,
            now=now,
        )


def stale_slots(storage, slots: torch.Tensor, th: RuleThresholds, dim: int) -> torch.Tensor:
    """(m,) bool: which of ``slots`` (occupied, of ``storage``, a TableStorage) hold a
    stale key by ``th``. Integer compares on the device, the norm in float64."""
    stale = torch.zeros(slots.shape, dtype=torch.bool, device=slots.device)
    if th.score_below is not None:
        stale |= storage.scores[slots] < _clamp64(th.score_below)
    if th.last_access_below is not None:
        stale |= getattr(storage, th.column)[slots] < _clamp64(th.last_access_below)
    if th.norm_below is not None:
        rows = storage.rows(slots, dim).to(torch.float64)
        stale |= torch.linalg.vector_norm(rows, dim=1) < th.norm_below
    return stale


def _clamp64(v: int) -> int:
    return max(-(2**63), min(2**63 - 1, v))


class ErasedKeys:
    """The keys one table erased by rule, in order, for ``erased_since``: a journal of
    tensors numbered from 0; ``erased_since`` drops what its reader has taken."""

    def __init__(self) -> None:
        self.first = 0  # the number of parts[0]
        self.parts: list[torch.Tensor] = []
        self.tracking = False  # nothing is kept until a reader takes a mark

    def add(self, keys: torch.Tensor) -> None:
        if self.tracking and keys.numel():
            self.parts.append(keys)

    @property
    def end(self) -> int:
        return self.first + len(self.parts)

    def since(self, mark: int, device) -> torch.Tensor:
        """The keys erased after ``mark`` (distinct), dropping those before it."""
        drop = max(0, min(mark, self.end) - self.first)
        del self.parts[:drop]
        self.first += drop
        if not self.parts:
            return torch.empty(0, dtype=torch.int64, device=device)
        return torch.unique(torch.cat(self.parts))


def erase_stale(model, rule: EvictionRule | None = None) -> dict[str, dict[str, int]]:
    """Erases, now, the stale keys of every dynamic table of ``model`` on this rank (a
    whole pass per table; keys of batches in flight are kept).

    Args:
        model: a (DMP-)sharded model, a sharded collection, or a
            BatchedDynamicEmbeddingTables.
        rule: the rule to apply to every table; None: each table's own
            ``eviction_rule`` (tables without one are skipped).

    Returns:
        ``{collection path: {table name: keys erased}}`` (paths as in incremental_dump).

    Raises:
        ValueError: a rule a table's score strategy cannot decide (nothing erased).
    """
    groups = list(_collection_groups(model))
    if rule is not None:  # every table checked before any changes
        for _, group in groups:
            for name, table in zip(group.table_names, group.tables, strict=True):
                rule.check(table.strategy_code, name)
    out: dict[str, dict[str, int]] = {}
    for path, group in groups:
        for name, count in group.erase_stale(rule).items():
            out.setdefault(path, {})[name] = count
    return out


def erased_mark(model) -> dict[str, dict[str, int]]:
    """Starts (or continues) journaling the keys erased by rule in every dynamic table
    of ``model`` on this rank; returns the mark to pass to ``erased_since``."""
    out: dict[str, dict[str, int]] = {}
    for path, group in _collection_groups(model):
        for name, journal in zip(group.table_names, group.erased_by_rule, strict=True):
            journal.tracking = True
            out.setdefault(path, {})[name] = journal.end
    return out


def erased_since(model, mark: dict[str, dict[str, int]]):
    """The keys erased by rule since ``mark`` (``erased_mark``'s or this function's),
    and the next mark: ``({collection path: {table name: (k,) int64 keys}}, mark)``.

    Beside an incremental dump, whose ``(keys, rows)`` cannot say that a key left: a
    reader applies these erasures, then the dump's rows (a key erased and stored again
    since is in both, and the dump's row is the current one). The journal forgets what
    is before ``mark``: one reader per model.
    """
    if not isinstance(mark, dict):
        raise TypeError(f"erased_since: mark must be erased_mark's dict, got {mark!r}")
    erased: dict[str, dict[str, torch.Tensor]] = {}
    for path, group in _collection_groups(model):
        for name, journal in zip(group.table_names, group.erased_by_rule, strict=True):
            at = mark.get(path, {}).get(name, journal.first)
            erased.setdefault(path, {})[name] = journal.since(at, group.device)
    return erased, erased_mark(model)


def _collection_groups(model):
    """``(collection path, group)`` of every group of dynamic tables of this rank, the
    paths as incremental dumps name them."""
    for path, group in table_groups(model):
        yield public_collection_path(path), group
