"""Option dataclasses of the public API, with validation (names mirror DynamicEmb)."""

import dataclasses
import math

from dynemb.types import DynamicEmbInitializerMode

__all__ = ["DynamicEmbInitializerArgs"]


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
