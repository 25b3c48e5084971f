"""What bench_table.py's W-table and table_hkv.py's HierarchicalKV sweep share: the table
settings, the peer's name, ``TableRun`` (one table of a run) and the distinct keys.

Example::

    >>> run = TableRun(dim=8, fast_fraction=0.1)
    >>> run.impl
    'dynemb.ScoredHashTable(hybrid,10% fast)'
    >>> distinct_keys(0, 3)  # (3,) int64, distinct, spread over [0, 2^63)
    tensor([...])
"""

import dataclasses

import torch

TABLE_DIM = 64  # W-table's value width
BUCKET_CAPACITY = 128
KEY_HIGH = 2**63 - 1  # torch.randint's exclusive bound: keys in [0, 2^63 - 1)
IMPL = "dynemb.ScoredHashTable"
ROOF = "torch.index_select"  # the peer: a gather of the same number of rows
HYBRID_HBM_FRACTION = 0.10  # --device cuda: a hybrid table's rows in HBM


@dataclasses.dataclass(frozen=True)
class TableRun:
    """One table of a run: its value width, its rows in the fast tier, the ops timed."""

    dim: int = TABLE_DIM
    fast_fraction: float | None = None  # hybrid tiers: this fraction of the rows is fast
    ops: tuple[str, ...] = ("find", "find_or_insert", "insert_or_assign", "erase")

    @property
    def impl(self) -> str:
        if self.fast_fraction is None:
            return IMPL
        return f"{IMPL}(hybrid,{self.fast_fraction:.0%} fast)"

    def metric(self, name: str) -> str:
        return name if self.dim == TABLE_DIM else f"{name}@dim={self.dim}"

    def fast_rows(self, slots: int) -> int | None:
        """The rows of a ``slots``-slot table in the fast tier (None: every row)."""
        return None if self.fast_fraction is None else int(self.fast_fraction * slots)


_MASK63 = 2**63 - 1
_MIX1, _MIX2 = 0x1E3779B97F4A7C15, 0x3F58476D1CE4E5B9  # odd, below 2^63


def mix63(counters: torch.Tensor) -> torch.Tensor:
    """``(n,) int64`` keys spread over [0, 2^63) from ``(n,) int64`` counters in [0, 2^63).

    A bijection of [0, 2^63) (odd multiplications mod 2^63 and xorshifts of
    non-negative values), so distinct counters give distinct keys; the same keys on
    every device (torch's int64 multiplication wraps on CPU and GPU alike).
    """
    x = (counters * _MIX1) & _MASK63
    x ^= x >> 31
    x = (x * _MIX2) & _MASK63
    x ^= x >> 29
    return x


def distinct_keys(start: int, n: int, device: torch.device | None = None) -> torch.Tensor:
    """(n,) int64 keys ``mix63(start), ..., mix63(start + n - 1)``, made on ``device``."""
    return mix63(torch.arange(start, start + n, dtype=torch.int64, device=device))
