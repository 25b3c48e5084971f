"""Score strategies as DynamicEmb names them: the ``ScoreStrategy`` alias, its
normalisation, and whether a strategy keeps a last-access time (re-exported by
dynemb.dynamicemb_config)."""

from dynemb.types import DynamicEmbScoreStrategy

ScoreStrategy = DynamicEmbScoreStrategy | tuple[DynamicEmbScoreStrategy, ...]
"""A score strategy, or the compound ``(TIMESTAMP, LFU)`` (DynamicEmb's typing alias)."""


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
    exactly {TIMESTAMP, LFU} (order kept).

    Raises:
        NotImplementedError: a tuple other than (TIMESTAMP, LFU).
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
        compound = {DynamicEmbScoreStrategy.TIMESTAMP, DynamicEmbScoreStrategy.LFU}
        if len(strategy) != 2 or set(strategy) != compound:
            raise NotImplementedError(
                "DynamicEmbTableOptions.score_strategy: the only compound strategy is "
                f"(TIMESTAMP, LFU), got {strategy!r}"
            )
        return strategy
    raise TypeError(
        "DynamicEmbTableOptions.score_strategy must be a DynamicEmbScoreStrategy or a tuple "
        f"of them, got {strategy!r}"
    )


__all__ = ["ScoreStrategy", "normalize_score_strategy", "score_strategy_has_timestamp_column"]
