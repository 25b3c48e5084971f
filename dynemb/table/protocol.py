"""``Table``: what the embedding kernel, the tiering, checkpoints and incremental dumps
need from a dynamic table, and nothing more.

Two classes implement it: ``ScoredHashTable`` (one table) and
``dynemb.tiering.CachedTable`` (a cache in front of a slow tier, whose ``buffers``
are the cache's). Callers depend on this protocol, never on a class's private
members (``make lint`` enforces it: ruff SLF001).

Rows are addressed by slot: ``find_slots`` / ``find_or_insert_slots`` give the slots
of keys, and the ops of ``dynemb._ops`` read and write ``buffers.tensors()`` at those
slots. A slot is valid while ``mutations`` is unchanged; readers hold
``lock.read()``, anything that moves keys ``lock.write()``.
"""

from typing import Protocol, runtime_checkable

import torch

from dynemb.table.rw_lock import RWLock
from dynemb.table.scored_hash_table import BatchStats
from dynemb.table.table_storage import TableStorage


@runtime_checkable
class Table(Protocol):
    """A dynamic table seen by slot (see the module docstring).

    Attributes:
        dim: embedding columns of a row.
        extra_columns: optimizer-state columns after them.
        seed: the initializer's seed (a new row is a function of (seed, key)).
    """

    dim: int
    extra_columns: int
    seed: int

    @property
    def device(self) -> torch.device: ...

    @property
    def value_dtype(self) -> torch.dtype: ...

    @property
    def lock(self) -> RWLock:
        """Readers of ``buffers`` hold ``lock.read()``; ops that move keys ``lock.write()``."""
        ...

    @property
    def mutations(self) -> int:
        """Changes whenever stored keys may have moved: older slots must be found again."""
        ...

    @property
    def buffers(self) -> TableStorage:
        """The buffers the ops address by slot (the op argument ``table``)."""
        ...

    @property
    def init_values(self) -> list[float]:
        """The ops' initializer list for new rows: ``[mode, a, b, lower, upper, extra]``."""
        ...

    def find_slots(self, keys: torch.Tensor) -> torch.Tensor:
        """(n,) int64 slots of keys, -1 where not stored; changes nothing."""
        ...

    def find_or_insert_slots(
        self, keys: torch.Tensor, accesses: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, BatchStats]:
        """Slots of distinct keys, inserting the missing ones (a training lookup)."""
        ...

    def capacity(self) -> int: ...

    def max_capacity(self) -> int: ...

    def size(self) -> int: ...

    def erase(self, keys: torch.Tensor) -> int: ...


__all__ = ["Table"]
