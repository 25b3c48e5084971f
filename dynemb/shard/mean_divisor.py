"""The divisor of TorchRec's MEAN pooling callback, exact where nothing is to be divided.

A sharded EBC with a row-wise MEAN table divides its whole output by a per-column
divisor after the output dist: the bag length for the row-wise MEAN features (their
ranks send partial sums), and for every other feature a length it sets to 1 only for
row-wise SUM features, then ``+ 1e-6`` everywhere. So a table-wise or column-wise
MEAN table, already averaged by its kernel, would be divided by its length a second
time, and every other feature by ``1 + 1e-6``. ``exact_divisor`` keeps TorchRec's
divisor for the row-wise MEAN features' columns and puts exactly 1 elsewhere.
"""

import torch


def divided_columns(
    embedding_names: list[str], embedding_dims: list[int], mean_features: list[str]
) -> torch.Tensor:
    """(sum(embedding_dims),) bool: the output columns of row-wise MEAN features.

    ``embedding_names`` / ``embedding_dims``: the sharded EBC's output features in
    order (a shared feature is named ``feature@table``); ``mean_features``: the
    features of its row-wise MEAN tables.
    """
    mean = set(mean_features)
    keep = torch.tensor([name.split("@")[0] in mean for name in embedding_names])
    return torch.repeat_interleave(keep, torch.tensor(embedding_dims, dtype=torch.int64))


def exact_divisor(divisor: torch.Tensor, columns: torch.Tensor) -> torch.Tensor:
    """``divisor`` ((batch, columns) float) with exactly 1 outside ``columns``."""
    columns = columns.to(divisor.device)
    return torch.where(columns, divisor, torch.ones((), dtype=divisor.dtype, device=divisor.device))


__all__ = ["divided_columns", "exact_divisor"]
