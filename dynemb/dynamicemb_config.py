"""Option dataclasses of the public API, with validation (names mirror DynamicEmb)."""

import dataclasses
import math
from typing import Any

import torch

from dynemb.types import DynamicEmbCheckMode, DynamicEmbInitializerMode, DynamicEmbScoreStrategy

__all__ = ["DynamicEmbInitializerArgs", "DynamicEmbTableOptions"]


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
            ``mean + 2 * std_dev``).
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

    def validate(self) -> None:
        """Raises TypeError / ValueError naming the offending field."""
        if not isinstance(self.mode, DynamicEmbInitializerMode):
            raise TypeError(
                f"DynamicEmbInitializerArgs.mode must be a DynamicEmbInitializerMode, got {self.mode!r}"
            )
        for name in ("mean", "std_dev", "value"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or not math.isfinite(v):
                raise ValueError(
                    f"DynamicEmbInitializerArgs.{name} must be a finite number, got {v!r}"
                )
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

    def resolved(self, capacity: int) -> tuple:
        """The op's ``init`` list ``[mode, a, b, lower, upper]`` for a table of ``capacity`` rows."""
        mode = self.mode
        if mode == DynamicEmbInitializerMode.UNIFORM:
            bound = math.sqrt(1.0 / max(1, capacity))
            lo = -bound if self.lower is None else self.lower
            hi = bound if self.upper is None else self.upper
            return (mode.value, lo, hi, lo, hi)
        if mode in (DynamicEmbInitializerMode.NORMAL, DynamicEmbInitializerMode.TRUNCATED_NORMAL):
            lo = self.mean - 2 * self.std_dev if self.lower is None else self.lower
            hi = self.mean + 2 * self.std_dev if self.upper is None else self.upper
            return (mode.value, self.mean, self.std_dev, lo, hi)
        if mode == DynamicEmbInitializerMode.CONSTANT:
            return (mode.value, self.value, 0.0, 0.0, 0.0)
        return (mode.value, 0.0, 0.0, 0.0, 0.0)


def _zeros() -> DynamicEmbInitializerArgs:
    return DynamicEmbInitializerArgs(mode=DynamicEmbInitializerMode.CONSTANT, value=0.0)


@dataclasses.dataclass
class DynamicEmbTableOptions:
    """Options of one dynamic table (field names and defaults mirror DynamicEmb).

    Args:
        dim: embedding width (``None``: taken from the TorchRec config by the planner).
        max_capacity: maximum rows on this rank (``None``: filled by the planner).
        init_capacity: initial rows (``None``: ``max_capacity``); the table doubles up
            to ``max_capacity`` before it evicts.
        index_type: key dtype (int64).
        embedding_dtype: row storage: float32, float16 or bfloat16.
        score_strategy: eviction score (see DynamicEmbScoreStrategy).
        bucket_capacity: slots per bucket (multiple of 16).
        initializer_args: rows of new keys in training.
        eval_initializer_args: rows of unknown keys in eval mode (zeros by default).
        safe_check_mode: what a training lookup does with keys that could not be
            stored (ERROR raises, WARNING warns, IGNORE is silent; both give zero rows).
        training: False makes the table read-only (lookups never insert).
        seed: initializer seed (rows are a function of (seed, key)).
        global_hbm_for_values, local_hbm_for_values: bytes of value rows (with optimizer
            state) kept in the fast tier, over all ranks / on this rank (the planner
            fills the local one). 0: no budget, every row is fast. Below the table's
            value bytes and without ``caching``, the table is hybrid: the other rows
            live in the slow tier (on a CPU both tiers are host memory).
        spill_directory: (dynemb only) keep each table's slot buffers and slow-tier
            rows in memory-mapped files under ``<spill_directory>/<table>.rank<r>``,
            so tables may exceed RAM (see ScoredHashTable's ``spill_directory``).
        caching, dist_type, admit_strategy, admission_counter, external_storage: used
            by sharding, tiering and admission (see DynamicEmb_APIs.md).

    Example::

        DynamicEmbTableOptions(dim=64, max_capacity=1 << 20,
                               score_strategy=DynamicEmbScoreStrategy.LFU)
    """

    dim: int | None = None
    max_capacity: int | None = None
    init_capacity: int | None = None
    index_type: torch.dtype = torch.int64
    embedding_dtype: torch.dtype = torch.float32
    score_strategy: DynamicEmbScoreStrategy | tuple = DynamicEmbScoreStrategy.TIMESTAMP
    bucket_capacity: int = 128
    initializer_args: DynamicEmbInitializerArgs = dataclasses.field(
        default_factory=DynamicEmbInitializerArgs
    )
    eval_initializer_args: DynamicEmbInitializerArgs = dataclasses.field(default_factory=_zeros)
    safe_check_mode: DynamicEmbCheckMode = DynamicEmbCheckMode.IGNORE
    training: bool = True
    seed: int = 0
    global_hbm_for_values: int = 0
    local_hbm_for_values: int = 0
    caching: bool = False
    dist_type: str = "roundrobin"
    admit_strategy: Any | None = None
    admission_counter: Any | None = None
    external_storage: Any | None = None
    spill_directory: str | None = None
