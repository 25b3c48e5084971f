"""A warm-start source that fails on demand (raises, or returns a bad shape), and the
weights it serves when it works."""

import torch

WEIGHT = torch.randn(1000, 4, generator=torch.Generator().manual_seed(1))


class Flaky:
    """An ids function (key k -> row k) that fails for non-empty batches while ``fail``
    is set: by raising, or by returning one row too few."""

    def __init__(self, how: str) -> None:
        self.how, self.fail, self.calls = how, False, 0

    def __call__(self, keys: torch.Tensor) -> torch.Tensor:
        if keys.numel():
            self.calls += 1
        if self.fail and keys.numel():
            if self.how == "raises":
                raise KeyError("source offline")
            return keys[1:]
        return keys
