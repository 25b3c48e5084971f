"""Argument checks of ScoredHashTable: each raises TypeError / ValueError naming the
argument, its value and what was expected, before the table changes."""

import torch

from dynemb._host_reads import read_to_host
from dynemb._ops import TIMESTAMP_DECAYED_LFU, TIMESTAMP_LFU
from dynemb.config.score_strategies import check_score_half_life
from dynemb.config.types import DynamicEmbScoreStrategy

ScoreStrategyArg = DynamicEmbScoreStrategy | tuple[DynamicEmbScoreStrategy, ...]


def strategy_code(strategy: ScoreStrategyArg) -> int:
    """The C++ code of a strategy or of a compound (TIMESTAMP, LFU | DECAYED_LFU)."""
    if isinstance(strategy, DynamicEmbScoreStrategy):
        return strategy.value
    ts, lfu = DynamicEmbScoreStrategy.TIMESTAMP, DynamicEmbScoreStrategy.LFU
    decayed = DynamicEmbScoreStrategy.DECAYED_LFU
    if isinstance(strategy, tuple) and len(strategy) == 2:
        if set(strategy) == {ts, lfu}:
            return TIMESTAMP_LFU
        if set(strategy) == {ts, decayed}:
            return TIMESTAMP_DECAYED_LFU
    raise ValueError(
        "score_strategy must be a DynamicEmbScoreStrategy or a compound "
        f"(TIMESTAMP, LFU) or (TIMESTAMP, DECAYED_LFU), got {strategy!r}"
    )


# The strategy codes whose tables keep a last-access time beside the score.
TIMESTAMP_CODES = (TIMESTAMP_LFU, TIMESTAMP_DECAYED_LFU)


def check_half_life(strategy: ScoreStrategyArg, half_life) -> int | None:
    """``score_half_life_steps`` checked against the strategy (score_strategies.py)."""
    return check_score_half_life(strategy, half_life, "score_half_life_steps")


def check_int(name: str, value, minimum: int, minimum_name: str | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {value!r}")
    if value < minimum:
        bound = f"{minimum_name}={minimum}" if minimum_name else str(minimum)
        raise ValueError(f"{name} must be >= {bound}, got {value}")


INT64_MAX = 2**63 - 1


def check_sizes(dim, capacity, init_capacity, bucket_capacity, extra_columns, column_offset) -> int:
    """A table's sizes, each checked by name; returns ``init_capacity`` (None:
    ``capacity``)."""
    check_int("dim", dim, 1)
    check_int("bucket_capacity", bucket_capacity, 16)
    if bucket_capacity % 16:
        raise ValueError(f"bucket_capacity must be a multiple of 16, got {bucket_capacity}")
    check_int("capacity", capacity, bucket_capacity, "bucket_capacity")
    init_capacity = capacity if init_capacity is None else init_capacity
    check_int("init_capacity", init_capacity, 1)
    if init_capacity > capacity:
        raise ValueError(f"init_capacity={init_capacity} exceeds capacity={capacity}")
    check_int("extra_columns", extra_columns, 0)
    check_int("column_offset", column_offset, 0)
    if column_offset + dim > 2**31:  # the initializer's column counters are 32 bits
        raise ValueError(f"column_offset + dim must be <= 2**31, got {column_offset} + {dim}")
    return init_capacity


def check_capacity_bytes(capacity: int, bytes_per_slot: int) -> None:
    """The table's buffers at ``capacity`` slots must be addressable by int64 byte
    offsets (torch sizes and the ops' slot arithmetic), else ValueError naming it."""
    if capacity * bytes_per_slot > INT64_MAX:
        raise ValueError(
            f"capacity={capacity} is too large: {capacity} slots x {bytes_per_slot} bytes "
            f"do not fit in int64 (at most {INT64_MAX // bytes_per_slot} slots of this table)"
        )


def check_keys(keys, device: torch.device) -> torch.Tensor:
    """keys: (n,) int64 on the table's device; returned contiguous."""
    if not isinstance(keys, torch.Tensor):
        raise TypeError(f"keys must be a torch.Tensor, got {type(keys).__name__}")
    if keys.dtype != torch.int64:
        raise TypeError(f"keys must have dtype torch.int64, got {keys.dtype}")
    if keys.dim() != 1:
        raise ValueError(f"keys must be 1-D, got shape {tuple(keys.shape)}")
    if keys.device != device:
        raise ValueError(f"keys are on {keys.device}, the table is on {device}")
    return keys.contiguous()


def check_distinct(op: str, keys: torch.Tensor) -> None:
    """keys: (n,) int64 that must not repeat (``op`` names the caller)."""
    if keys.numel() < 2:
        return
    ordered = torch.sort(keys).values
    same = torch.nonzero(ordered[1:] == ordered[:-1], as_tuple=True)[0]
    if same.numel():
        key = read_to_host(ordered[same[0]], "error message").item()
        positions = read_to_host(
            torch.nonzero(keys == key, as_tuple=True)[0], "error message"
        ).tolist()
        raise ValueError(
            f"{op}: `keys` must be distinct, got key {key} at positions {positions}; "
            "de-duplicate the entries first"
        )


def check_scores(scores, keys, customized: bool, strategy, device) -> torch.Tensor | None:
    """scores: (n,) int64 >= 0, required under CUSTOMIZED and refused otherwise."""
    if scores is None:
        if customized:
            raise ValueError("scores are required: the table's score_strategy is CUSTOMIZED")
        return None
    if not customized:
        raise ValueError(f"scores are accepted only under CUSTOMIZED; this table uses {strategy}")
    if not isinstance(scores, torch.Tensor) or scores.dtype != torch.int64:
        raise TypeError(
            f"scores must be an int64 tensor, got {getattr(scores, 'dtype', type(scores))}"
        )
    if scores.shape != keys.shape:
        raise ValueError(f"scores must have shape {tuple(keys.shape)}, got {tuple(scores.shape)}")
    low = read_to_host(scores.min(), "score check").item() if scores.numel() else 0
    if low < 0:
        raise ValueError(f"scores must be >= 0, got minimum {low}")
    return scores.to(device).contiguous()


def check_meta(name: str, meta, keys, device) -> torch.Tensor | None:
    """A per-key int64 column (saved scores or timestamps): (n,) int64 >= 0, or None.
    (A negative value is no score the table gives: read as uint64 it would outrank
    every key, and it could not be saved again.)"""
    if meta is None:
        return None
    if not isinstance(meta, torch.Tensor) or meta.dtype != torch.int64:
        raise TypeError(f"{name} must be an int64 tensor, got {getattr(meta, 'dtype', type(meta))}")
    if meta.shape != keys.shape:
        raise ValueError(f"{name} must have shape {tuple(keys.shape)}, got {tuple(meta.shape)}")
    if meta.numel() and read_to_host((meta < 0).any(), "metadata check").item():
        at = torch.nonzero(meta < 0)[0, 0]
        value, key = read_to_host(
            torch.stack([meta[at].to(torch.int64), keys[at]]), "error message"
        ).tolist()
        raise ValueError(f"{name} must be >= 0, got {value} for key {key}")
    return meta.to(device).contiguous()


def check_values(values, keys, dim: int, row_width: int, dtype, device) -> torch.Tensor:
    """values: (n, dim) or (n, row_width) floats; returned in the table's dtype."""
    if not isinstance(values, torch.Tensor) or not values.is_floating_point():
        raise TypeError(
            f"values must be a floating-point tensor, got {getattr(values, 'dtype', type(values))}"
        )
    n = keys.numel()
    if values.dim() != 2 or values.shape[0] != n or values.shape[1] not in (dim, row_width):
        raise ValueError(
            f"values must have shape ({n}, {dim})"
            + (f" or ({n}, {row_width})" if row_width != dim else "")
            + f", got {tuple(values.shape)}"
        )
    return values.to(device=device, dtype=dtype).contiguous()


def output_rows(out, n: int, dim: int, dtype, device) -> torch.Tensor:
    """``out`` checked, or a new (n, dim) output (uninitialised: the ops write every row)."""
    shape = (n, dim)
    if out is None:
        return torch.empty(shape, dtype=dtype, device=device)
    if (
        not isinstance(out, torch.Tensor)
        or tuple(out.shape) != shape
        or out.dtype != dtype
        or out.device != device
        or not out.is_contiguous()
    ):
        raise ValueError(
            f"out must be a contiguous {dtype} tensor of shape {shape} on {device}, "
            f"got {describe_tensor(out)}"
        )
    return out


def describe_tensor(t) -> str:
    if not isinstance(t, torch.Tensor):
        return type(t).__name__
    layout = "contiguous" if t.is_contiguous() else "non-contiguous"
    return f"{layout} {t.dtype} tensor of shape {tuple(t.shape)} on {t.device}"
