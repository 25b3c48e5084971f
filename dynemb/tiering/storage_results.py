"""What a cached table accepts back from its ``Storage``: every result of ``find`` and
``insert`` is checked against the table's row layout before it is used, so that a
storage returning rows of another width, dtype or count raises an error naming the
storage and the table instead of a shape error deep inside the cache (or a silent
cast)."""

import torch

from dynemb.config.storage import Storage


def checked_find(
    storage: Storage, keys: torch.Tensor, row_width: int, dtype: torch.dtype, table: str
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``storage.find(keys)``, checked.

    Args:
        storage: the slow tier.
        keys: (n,) int64.
        row_width: columns of a full row (``dim + state_columns``).
        dtype: the table's value dtype.
        table: the table's name, for messages.

    Returns:
        ``(rows, scores, found)``: (n, row_width) ``dtype``, (n,) int64, (n,) bool.

    Raises:
        TypeError: a result that is not such a tensor, naming the storage, the table,
            the method, the result and what it should be.
    """
    n = keys.numel()
    result = storage.find(keys)
    rows, scores, found = _three(storage, table, "find", result)
    _check(storage, table, "find", "rows", rows, (n, row_width), dtype)
    _check(storage, table, "find", "scores", scores, (n,), torch.int64)
    _check(storage, table, "find", "found", found, (n,), torch.bool)
    return rows, scores, found


def checked_insert(
    storage: Storage,
    keys: torch.Tensor,
    rows: torch.Tensor,
    scores: torch.Tensor,
    table: str,
) -> torch.Tensor:
    """``storage.insert(keys, rows, scores)``, checked; returns the dropped keys (m,)
    int64 (at most n). Raises TypeError as ``checked_find``."""
    n = keys.numel()
    dropped_keys, dropped_rows, dropped_scores = _three(
        storage, table, "insert", storage.insert(keys, rows, scores)
    )
    if not isinstance(dropped_keys, torch.Tensor) or dropped_keys.dim() != 1:
        got = (
            f"a {tuple(dropped_keys.shape)} tensor"
            if isinstance(dropped_keys, torch.Tensor)
            else type(dropped_keys).__name__
        )
        _fail(storage, table, "insert", "dropped keys", got, "an (m,) int64 tensor")
    m = dropped_keys.shape[0]
    if m > n:
        _fail(storage, table, "insert", "dropped keys", f"{m} keys", f"at most the {n} inserted")
    _check(storage, table, "insert", "dropped keys", dropped_keys, (m,), torch.int64)
    _check(storage, table, "insert", "dropped rows", dropped_rows, (m, rows.shape[1]), rows.dtype)
    _check(storage, table, "insert", "dropped scores", dropped_scores, (m,), torch.int64)
    return dropped_keys


def _three(storage, table: str, method: str, result) -> tuple:
    if not isinstance(result, tuple | list) or len(result) != 3:
        got = (
            f"a {type(result).__name__} of {len(result)}"
            if isinstance(result, tuple | list)
            else type(result).__name__
        )
        _fail(storage, table, method, "result", got, "a tuple of 3 tensors")
    return tuple(result)


def _check(storage, table, method, what, value, shape: tuple, dtype: torch.dtype) -> None:
    want = f"a {shape} {dtype} tensor"
    if not isinstance(value, torch.Tensor):
        _fail(storage, table, method, what, type(value).__name__, want)
    if tuple(value.shape) != shape or (value.dtype != dtype and value.numel()):
        _fail(storage, table, method, what, f"a {tuple(value.shape)} {value.dtype} tensor", want)


def _fail(storage, table: str, method: str, what: str, got, want: str):
    raise TypeError(
        f"table {table!r}: {type(storage).__name__}.{method} (its external_storage) "
        f"returned {what} {got}, expected {want}"
    )


__all__ = ["checked_find", "checked_insert"]
