"""Score strategies as DynamicEmb names them: the ``ScoreStrategy`` alias, its
normalisation, whether a strategy keeps a last-access time, the eviction name it
implies (re-exported by dynemb.dynamicemb_config); and dynemb's DECAYED_LFU: its
half-life check, the counts its scores stand for, and the label checkpoints and
deltas record (strategy and half-life)."""

import warnings

import torch

from dynemb._ops import DECAY_FRACTION_BITS, MAX_HALF_LIFE  # the core's bounds (csrc/core/decay.h)
from dynemb.config.types import DynamicEmbEvictStrategy, DynamicEmbScoreStrategy

ScoreStrategy = DynamicEmbScoreStrategy | tuple[DynamicEmbScoreStrategy, ...]
"""A score strategy, or a compound ``(TIMESTAMP, LFU)`` / ``(TIMESTAMP, DECAYED_LFU)``
(DynamicEmb's typing alias)."""

_COMPOUNDS = (
    {DynamicEmbScoreStrategy.TIMESTAMP, DynamicEmbScoreStrategy.LFU},
    {DynamicEmbScoreStrategy.TIMESTAMP, DynamicEmbScoreStrategy.DECAYED_LFU},
)


def score_strategy_has_timestamp_column(score_strategy: ScoreStrategy | None) -> bool:
    """Whether the strategy keeps a last-access time per row: TIMESTAMP, or a compound
    holding it (``(TIMESTAMP, LFU)``). Such tables dump incrementally by time (rows
    touched since the threshold time); the others by score >= threshold.

    Example::

        score_strategy_has_timestamp_column((DynamicEmbScoreStrategy.TIMESTAMP,
                                             DynamicEmbScoreStrategy.LFU))  # True
    """
    if isinstance(score_strategy, tuple):
        return DynamicEmbScoreStrategy.TIMESTAMP in score_strategy
    return score_strategy == DynamicEmbScoreStrategy.TIMESTAMP


def normalize_score_strategy(strategy):
    """DynamicEmb's normalisation: None kept, a 1-tuple unwrapped, a longer tuple must be
    exactly {TIMESTAMP, LFU} or {TIMESTAMP, DECAYED_LFU} (order kept).

    Raises:
        NotImplementedError: a tuple other than (TIMESTAMP, LFU) or (TIMESTAMP, DECAYED_LFU).
        TypeError: a value that is not a DynamicEmbScoreStrategy (or a tuple of them).
    """
    if strategy is None or isinstance(strategy, DynamicEmbScoreStrategy):
        return strategy
    if isinstance(strategy, tuple):
        for s in strategy:
            if not isinstance(s, DynamicEmbScoreStrategy):
                raise TypeError(
                    "DynamicEmbTableOptions.score_strategy must hold DynamicEmbScoreStrategy "
                    f"members, got {s!r} in {strategy!r}"
                )
        if len(strategy) == 1:
            return strategy[0]
        if len(strategy) != 2 or set(strategy) not in _COMPOUNDS:
            raise NotImplementedError(
                "DynamicEmbTableOptions.score_strategy: the compound strategies are "
                f"(TIMESTAMP, LFU) and (TIMESTAMP, DECAYED_LFU), got {strategy!r}"
            )
        return strategy
    raise TypeError(
        "DynamicEmbTableOptions.score_strategy must be a DynamicEmbScoreStrategy or a tuple "
        f"of them, got {strategy!r}"
    )


def score_strategy_decays(score_strategy: ScoreStrategy | None) -> bool:
    """Whether the strategy scores by a decayed count: DECAYED_LFU, alone or in the
    compound ``(TIMESTAMP, DECAYED_LFU)``. Such tables need a half-life."""
    if isinstance(score_strategy, tuple):
        return DynamicEmbScoreStrategy.DECAYED_LFU in score_strategy
    return score_strategy == DynamicEmbScoreStrategy.DECAYED_LFU


def check_score_half_life(score_strategy, half_life, name: str = "score_half_life_steps"):
    """The half-life (steps) a strategy takes: a positive int under DECAYED_LFU (alone or
    in its compound), None under any other strategy.

    Raises:
        TypeError: ``half_life`` is not an int (or None).
        ValueError: missing under DECAYED_LFU, out of range, or given to another
            strategy (it would be ignored).
    """
    if half_life is not None and (isinstance(half_life, bool) or not isinstance(half_life, int)):
        raise TypeError(f"{name} must be an int number of steps or None, got {half_life!r}")
    if not score_strategy_decays(score_strategy):
        if half_life is not None:
            raise ValueError(
                f"{name}={half_life} applies to DECAYED_LFU scores only; "
                f"score_strategy is {score_strategy!r}: leave it None"
            )
        return None
    if half_life is None or not 1 <= half_life <= MAX_HALF_LIFE:
        raise ValueError(
            f"{name} must be an int in [1, {MAX_HALF_LIFE}] (training steps after which "
            f"an access weighs half) under score_strategy={score_strategy!r}, got {half_life!r}"
        )
    return half_life


def evict_strategy_of(score_strategy: ScoreStrategy | None) -> DynamicEmbEvictStrategy:
    """DynamicEmb's eviction name for a score strategy: TIMESTAMP -> LRU; STEP,
    CUSTOMIZED, NO_EVICTION -> CUSTOMIZED; LFU, DECAYED_LFU and the compounds -> LFU.

    Example::

        evict_strategy_of(DynamicEmbScoreStrategy.STEP)  # DynamicEmbEvictStrategy.CUSTOMIZED
    """
    lfu = (DynamicEmbScoreStrategy.LFU, DynamicEmbScoreStrategy.DECAYED_LFU)
    if isinstance(score_strategy, tuple) or score_strategy in lfu:
        return DynamicEmbEvictStrategy.LFU
    if score_strategy in (None, DynamicEmbScoreStrategy.TIMESTAMP):
        return DynamicEmbEvictStrategy.LRU
    return DynamicEmbEvictStrategy.CUSTOMIZED


def resolved_evict_strategy(name: str, options) -> DynamicEmbEvictStrategy:
    """The eviction ``options.score_strategy`` implies (``options``: a
    DynamicEmbTableOptions); warns (``UserWarning``, naming the
    table) when the user set a different, non-default ``evict_strategy``.

    DynamicEmb overwrites ``evict_strategy`` silently; dynemb says so.
    """
    implied = evict_strategy_of(options.score_strategy)
    chosen = options.evict_strategy
    if chosen != DynamicEmbEvictStrategy.LRU and chosen != implied:
        warnings.warn(
            f"table {name!r}: evict_strategy={chosen} is ignored; score_strategy="
            f"{options.score_strategy!r} decides the eviction ({implied})",
            UserWarning,
            stacklevel=3,
        )
    return implied


def decayed_count(scores, step: int, half_life_steps: int):
    """The decayed access counts that DECAYED_LFU scores stand for at ``step``.

    A score is ``L = s + H * log2(n(s))`` in units of 2**-16 step (csrc/core/decay.h),
    whatever the step s it is read at, so the count at ``step`` is
    ``2 ** ((L / 2**16 - step) / H)``.

    Args:
        scores: (n,) int64 scores (``ScoredHashTable.get_scores``, a dump's scores).
        step: the table step to read the counts at (``table.score_step``), an int >= 0.
        half_life_steps: the table's ``score_half_life_steps``.

    Returns:
        (n,) float64 decayed counts (1.0: one access in the batch of ``step``).

    Raises:
        TypeError / ValueError: ``scores`` not an int64 tensor; ``step`` or
        ``half_life_steps`` not an int in range.

    Example::

        >>> t = ScoredHashTable(dim=4, capacity=64, bucket_capacity=16,
        ...                     score_strategy=DynamicEmbScoreStrategy.DECAYED_LFU,
        ...                     score_half_life_steps=10)
        >>> for _ in range(3):
        ...     _ = t.find_or_insert(torch.tensor([7]))
        >>> decayed_count(t.get_scores(torch.tensor([7])), t.score_step + 10, 10)
        tensor([1.4018], dtype=torch.float64)  # (1 + 2**-0.1 + 2**-0.2) / 2
    """
    if not isinstance(scores, torch.Tensor) or scores.dtype != torch.int64:
        raise TypeError(
            f"decayed_count: `scores` must be an int64 tensor, got "
            f"{getattr(scores, 'dtype', type(scores).__name__)}"
        )
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"decayed_count: `step` must be an int >= 0, got {step!r}")
    check_score_half_life(DynamicEmbScoreStrategy.DECAYED_LFU, half_life_steps, "half_life_steps")
    steps = scores.double() / 2**DECAY_FRACTION_BITS - step
    return torch.exp2(steps / half_life_steps)


def score_strategy_label(table) -> str:
    """How checkpoints and deltas name a table's scoring, compared on load: the strategy,
    and for DECAYED_LFU its half-life (scores of another half-life mean other counts).
    ``table``: a ScoredHashTable or CachedTable."""
    half_life = table.score_half_life_steps
    label = str(table.score_strategy)
    return label if half_life is None else f"{label} (score_half_life_steps={half_life})"


__all__ = [
    "ScoreStrategy",
    "check_score_half_life",
    "decayed_count",
    "evict_strategy_of",
    "normalize_score_strategy",
    "resolved_evict_strategy",
    "score_strategy_decays",
    "score_strategy_has_timestamp_column",
    "score_strategy_label",
]
