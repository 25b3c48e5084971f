"""``Storage``: the batch interface of a slow tier (the table behind a cache).

In caching mode (``DynamicEmbTableOptions.caching=True``) a table is two tiers: a
fast scored hash table acting as a cache (dynemb.tiering.cached_table) in front of
a ``Storage`` that holds every row. The cache talks to its storage only through
the six batch methods below, so a user can put the slow tier in a parameter
server of their own by implementing them and passing the class (or any callable
taking a ``StorageSpec``) as ``DynamicEmbTableOptions.external_storage``.

A row is the full value row: ``dim`` embedding columns followed by
``state_columns`` optimizer-state columns, in ``value_dtype``. A score is the
key's score under the table's score strategy (0 under NO_EVICTION), an int64.
Keys in a batch are distinct.
"""

import abc
import dataclasses

import torch

from dynemb.config.types import DynamicEmbScoreStrategy


@dataclasses.dataclass(frozen=True)
class StorageSpec:
    """What a storage must hold (given to ``external_storage`` factories).

    Attributes:
        dim: embedding columns of a row.
        state_columns: optimizer-state columns after them.
        value_dtype: float32, float16 or bfloat16.
        capacity: rows the table was configured for (``max_capacity``).
        score_strategy: the table's score strategy.
        bucket_capacity: the table's ``bucket_capacity`` option.
        device: where rows are handed over (the tables' device).
        table_name: the table's name, for messages.
    """

    dim: int
    state_columns: int
    value_dtype: torch.dtype
    capacity: int
    score_strategy: DynamicEmbScoreStrategy | tuple
    bucket_capacity: int
    device: torch.device
    table_name: str = ""

    @property
    def row_width(self) -> int:
        return self.dim + self.state_columns


class Storage(abc.ABC):
    """A batch key -> (row, score) store: the slow tier of a cached table.

    Implementations need not be thread-safe: the cache calls one method at a time
    per storage. They may drop rows when full (a scored table evicts); ``insert``
    reports what it dropped so that nothing leaves the table unreported.

    Example::

        class DictStorage(Storage):  # a toy parameter server
            def __init__(self, spec):
                self.spec, self.rows = spec, {}

            def find(self, keys):
                n, w = keys.numel(), self.spec.row_width
                rows = torch.zeros((n, w), dtype=self.spec.value_dtype)
                scores = torch.zeros(n, dtype=torch.int64)
                found = torch.zeros(n, dtype=torch.bool)
                for i, k in enumerate(keys.tolist()):
                    if k in self.rows:
                        rows[i], scores[i] = self.rows[k]
                        found[i] = True
                return rows, scores, found
            ...

        options = DynamicEmbTableOptions(dim=16, max_capacity=1 << 20, caching=True,
                                         local_hbm_for_values=1 << 20,
                                         external_storage=DictStorage)
    """

    @abc.abstractmethod
    def find(self, keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Looks keys up without changing anything.

        Args:
            keys: (n,) int64, distinct.

        Returns:
            ``(rows, scores, found)``: (n, row_width) value dtype (anything where not
            found), (n,) int64, (n,) bool.
        """

    @abc.abstractmethod
    def insert(
        self, keys: torch.Tensor, rows: torch.Tensor, scores: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Stores (or overwrites) full rows with their scores.

        Args:
            keys: (n,) int64, distinct. rows: (n, row_width). scores: (n,) int64.

        Returns:
            ``(keys, rows, scores)`` of the entries dropped to make room (including
            keys of this batch that could not be stored): (m,), (m, row_width), (m,).
        """

    @abc.abstractmethod
    def erase(self, keys: torch.Tensor) -> int:
        """Removes keys; returns how many were stored."""

    @abc.abstractmethod
    def export_batch(
        self, offset: int, n: int
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
        """Exports the entries of positions ``[offset, offset + n)``.

        Iterating ``offset = 0, next_offset, ...`` until ``next_offset == end_offset()``
        visits every entry once, provided the storage does not change in between.

        Returns:
            ``(keys, rows, scores, next_offset)``: (m,) int64, (m, row_width), (m,) int64.
        """

    @abc.abstractmethod
    def end_offset(self) -> int:
        """The offset at which ``export_batch`` iteration stops."""

    @abc.abstractmethod
    def size(self) -> int:
        """Number of stored keys."""

    def load(self, keys: torch.Tensor, rows: torch.Tensor, scores: torch.Tensor) -> int:
        """Bulk import (e.g. from a checkpoint); returns the number of rows dropped."""
        return int(self.insert(keys, rows, scores)[0].numel())


__all__ = ["Storage", "StorageSpec"]
