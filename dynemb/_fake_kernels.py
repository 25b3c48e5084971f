"""Fake (meta) kernels of the read-only lookup ops, so that torch.export and
torch.compile trace a lookup without data.

An output's shape depends only on the input shapes (and the op's ``dim``): the
tracer never runs the table. Registered for both op libraries (``dynemb`` and
``dynemb_cuda_emulated``, which share the schemas of csrc/torch/op_schemas.h).
Ops that mutate the table (inserts, backward) have none: an exported program only
looks tables up.
"""

import torch

_LIBRARIES = ("dynemb", "dynemb_cuda_emulated")


def _find_slots(table, keys):
    """table_find_slots: slots (n,) int64."""
    return torch.empty_like(keys)


def _pool(table, slots, keys, offsets, weights, mode, missing, seed, dim):
    """embedding_pool: (num_bags, dim) float32, num_bags = len(offsets) - 1."""
    return offsets.new_empty((offsets.shape[0] - 1, dim), dtype=torch.float32)


def _gather(table, slots, keys, missing, seed, dim):
    """embedding_gather: (n, dim) float32."""
    return keys.new_empty((keys.shape[0], dim), dtype=torch.float32)


def _pool_quantized(table, rows, format, slots, keys, offsets, weights, mode, missing, seed, dim):
    """embedding_pool_quantized: (num_bags, dim) float32."""
    return offsets.new_empty((offsets.shape[0] - 1, dim), dtype=torch.float32)


def _gather_quantized(table, rows, format, slots, keys, missing, seed, dim):
    """embedding_gather_quantized: (n, dim) float32."""
    return keys.new_empty((keys.shape[0], dim), dtype=torch.float32)


_FAKES = {
    "table_find_slots": _find_slots,
    "embedding_pool": _pool,
    "embedding_gather": _gather,
    "embedding_pool_quantized": _pool_quantized,
    "embedding_gather_quantized": _gather_quantized,
}


def register() -> None:
    """Registers the fake kernels (once per process; dynemb._ops calls it at import)."""
    for library in _LIBRARIES:
        for op, fake in _FAKES.items():
            torch.library.register_fake(f"{library}::{op}", fake)


__all__ = ["register"]
