"""Typed wrappers over the embedding ops of ``torch.ops.dynemb.*`` (pooling, gather,
backward, key de-duplication; csrc/torch/embedding_op_impls.h), re-exported by
dynemb/_ops.py, the one Python path to C++."""

from collections.abc import Sequence

import torch

from dynemb._executor import _dynemb


def unique_keys(keys: torch.Tensor) -> tuple:
    """De-duplicates keys in first-occurrence order (CPU; any order on a GPU).

    Returns ``(unique (U,), inverse (n,), counts (U,))``, all int64, with
    ``unique[inverse] == keys`` and ``counts`` the occurrences of each unique key.
    """
    return _dynemb.unique_keys(keys)


def unique_keys_grouped(keys: Sequence[torch.Tensor]) -> tuple:
    """``unique_keys`` of each tensor of ``keys`` in one executor call: ``(unique,
    inverse, counts)``, each a list with one tensor per entry of ``keys`` (at least one)."""
    keys = list(keys)
    if not keys:
        raise ValueError("unique_keys_grouped needs at least one keys tensor, got none")
    return _dynemb.unique_keys_grouped(keys)


def unique_keys_grouped_padded(keys: Sequence[torch.Tensor]) -> tuple:
    """``unique_keys_grouped`` without a read of the device: ``(unique, inverse, counts,
    num_unique)``; ``unique[t]`` and ``counts[t]`` have the length of ``keys[t]``, their
    first ``num_unique[t]`` entries are ``unique_keys``' result; ``num_unique`` (T,)
    int64 stays on the keys' device (read later, with what else the host needs)."""
    keys = list(keys)
    if not keys:
        raise ValueError("unique_keys_grouped_padded needs at least one keys tensor, got none")
    return _dynemb.unique_keys_grouped_padded(keys)


def embedding_pool(table, slots, keys, offsets, weights, mode: int, missing, seed: int, dim: int):
    """Pools bags of rows by slot: (num_bags, dim) float32 (core/pooling.h).

    Args:
        slots, keys: (n,) int64; a slot of -1 takes the ``missing`` initializer's row of its key.
        offsets: (num_bags + 1,) int64. weights: (n,) float32 or None.
        mode: 0 SUM, 1 MEAN. missing: the ``Init`` of keys without a row.
    """
    return _dynemb.embedding_pool(
        list(table), slots, keys, offsets, weights, mode, missing, seed, dim
    )


def embedding_pool_into(
    table, slots, keys, offsets, weights, mode: int, missing, seed: int, dim: int, out, columns
) -> None:
    """embedding_pool written into ``out`` (B, width) float32 (rows contiguous, any row
    stride): with K = ``columns.numel()`` features and num_bags = K * B feature-major
    bags, bag ``k * B + b`` goes to ``out[b, columns[k] : columns[k] + dim]``.

    Args:
        columns: (K,) int64 column offsets on the table's device, each in [0, width - dim].
    """
    _dynemb.embedding_pool_into(
        list(table), slots, keys, offsets, weights, mode, missing, seed, dim, out, columns
    )


def embedding_pool_into_grouped(
    tables, slots, keys, offsets, weights, mode: int, missing, seeds, dims, out, columns,
    inverse=None,
) -> None:  # fmt: skip
    """embedding_pool_into of several tables in one executor call (one launch on a GPU):
    every argument but ``mode`` and ``out`` is a list with one entry per table (``tables``:
    each table's ``TABLE_TENSORS``; ``weights``: None or one tensor per table;
    ``missing``: one ``Init`` per table). The tables' values must share a dtype.

    ``inverse``: None (``slots[t]`` holds a slot per index), or one (n,) int64 tensor per
    table: ``slots[t]`` then holds a slot per distinct key (a lookup's ``unique_slots``)
    and index i pools the row of ``slots[t][inverse[t][i]]``, with no per-index copy."""
    _dynemb.embedding_pool_into_grouped(
        [x for table in tables for x in table], slots, inverse or [], keys, offsets,
        weights or [], mode, [v for m in missing for v in m], seeds, dims, out, columns,
    )  # fmt: skip


def embedding_gather(table, slots, keys, missing, seed: int, dim: int) -> torch.Tensor:
    """One row per index: (n, dim) float32."""
    return _dynemb.embedding_gather(list(table), slots, keys, missing, seed, dim)


def embedding_pool_quantized(
    table, rows, format: int, slots, keys, offsets, weights, mode: int, missing, seed: int,
    dim: int,
):  # fmt: skip
    """embedding_pool over 8-bit rows (csrc/core/quantized_rows.h): (num_bags, dim) float32.

    Args:
        table: the hash table's op tensors (its keys give the slots; values not read).
        rows: (num_slots, row_bytes) uint8, the 8-bit row of each slot.
        format: ROW_FORMAT_CODES (0 INT8, 1 E4M3). Others as ``embedding_pool``.
    """
    return _dynemb.embedding_pool_quantized(
        list(table), rows, format, slots, keys, offsets, weights, mode, missing, seed, dim
    )


def embedding_gather_quantized(
    table, rows, format: int, slots, keys, missing, seed: int, dim: int
) -> torch.Tensor:
    """embedding_gather over 8-bit rows: one decoded row per index, (n, dim) float32."""
    return _dynemb.embedding_gather_quantized(
        list(table), rows, format, slots, keys, missing, seed, dim
    )


def embedding_backward(
    table, unique_slots, inverse, offsets, weights, mode: int, grad, optimizer, step: int, dim: int,
    columns=None,
) -> None:  # fmt: skip
    """Reduces grad (num_bags, dim) to one gradient per distinct key and applies the
    optimizer ``[kind, lr, eps, beta1, beta2, weight_decay]`` to its row in place.

    Args:
        unique_slots: (U,) int64, slot of each distinct key (-1: skipped).
        inverse: (n,) int64, distinct-key id of each index.
        columns: None, or (K,) int64: then ``grad`` is (B, width) with num_bags = K * B
            and bag ``k * B + b``'s gradient is ``grad[b, columns[k] : columns[k] + dim]``
            (a module's output gradient, read in place).
    """
    _dynemb.embedding_backward(
        list(table), unique_slots, inverse, offsets, weights, mode, grad, optimizer, step, dim,
        columns,
    )  # fmt: skip


def embedding_backward_grouped(
    tables, unique_slots, inverse, offsets, weights, mode: int, grad, optimizer, step: int, dims,
    columns,
) -> None:  # fmt: skip
    """embedding_backward(columns=) of several distinct tables in one executor call (one
    launch per phase on a GPU): lists with one entry per table as in
    ``embedding_pool_into_grouped``; ``grad``, ``optimizer`` and ``step`` are shared."""
    _dynemb.embedding_backward_grouped(
        [x for table in tables for x in table], unique_slots, inverse, offsets, weights or [],
        mode, grad, optimizer, step, dims, columns,
    )  # fmt: skip
