"""A sample of one table's id stream: checked batches, loaded traces, hash sub-sampling.

A sample is a list of 1-D int64 tensors, one per batch in stream order, or the path of
a trace file holding such a list (``torch.save(batches, path)``). ``keep_ids`` keeps
the ids whose sampling hash falls in one of ``scale`` classes: every occurrence of a
kept id stays, so the kept stream is the stream of a random ``1 / scale`` of the ids.
The sampling hash is a splitmix64 finaliser of the salted id, independent of the
table's bucket hash (murmur3's), so kept ids spread over all of a table's buckets.
"""

import os
from collections.abc import Sequence

import numpy as np
import torch

__all__ = ["IdSample", "check_id_sample", "keep_ids"]

IdSample = Sequence[torch.Tensor] | str | os.PathLike
"""Batches of ids (1-D int64 tensors, stream order) or the path of a ``torch.save``d list."""

_SALT = np.uint64(0x2545F4914F6CDD1D)


def check_id_sample(sample: object, name: str = "sample") -> list[torch.Tensor]:
    """Returns the sample's batches as contiguous CPU int64 tensors.

    Args:
        sample: a list (or tuple) of 1-D int64 tensors, one per batch, or the path of a
            trace file written by ``torch.save(list_of_tensors, path)``.
        name: the argument's name in error messages.

    Raises:
        TypeError: not a list of tensors / path, or a batch that is not an int64 tensor.
        ValueError: a batch that is not 1-D, or a sample without any id.
    """
    if isinstance(sample, (str, os.PathLike)):
        path = os.fspath(sample)
        sample = torch.load(path, weights_only=True)
        name = f"{name} (trace file {path!r})"
    if isinstance(sample, torch.Tensor) or not isinstance(sample, (list, tuple)):
        raise TypeError(
            f"{name} must be a list of 1-D int64 id tensors (one per batch) or the path "
            f"of a trace file holding one, got {type(sample).__name__}"
        )
    batches = []
    for i, batch in enumerate(sample):
        if not isinstance(batch, torch.Tensor):
            raise TypeError(
                f"{name}[{i}] must be a torch.Tensor of ids, got {type(batch).__name__}"
            )
        if batch.dtype != torch.int64:
            raise TypeError(f"{name}[{i}] must have dtype torch.int64 (ids), got {batch.dtype}")
        if batch.dim() != 1:
            raise ValueError(
                f"{name}[{i}] must be 1-D (one batch of ids), got shape {tuple(batch.shape)}"
            )
        batches.append(batch.detach().to("cpu").contiguous())
    if sum(b.numel() for b in batches) == 0:
        raise ValueError(
            f"{name} is empty ({len(batches)} batches, 0 ids): give at least one batch of ids"
        )
    return batches


def keep_ids(batches: list[torch.Tensor], scale: int) -> list[torch.Tensor]:
    """The occurrences of the ids whose sampling hash is 0 modulo ``scale`` (all for 1)."""
    if scale == 1:
        return batches
    kept = []
    for batch in batches:
        h = batch.numpy().view(np.uint64) ^ _SALT
        with np.errstate(over="ignore"):
            h = (h ^ (h >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
            h = (h ^ (h >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        h ^= h >> np.uint64(31)
        kept.append(batch[torch.from_numpy(h % np.uint64(scale) == 0)])
    return kept
