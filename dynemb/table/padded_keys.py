"""A table's distinct keys of a batch before the host has read how many there are.

On a GPU the number of distinct keys is a device value: reading it waits for the
stream. A cached table's training lookup reads the device anyway (its cache claim's
status counts decide what moves between the tiers), so its claim runs on the padded
keys, bounded on the device by their count (``table_find_or_insert_slots(...,
live=)``), and the count rides along with the claim's read (``_host_reads.
DeferredRead``): one read of the device instead of two.
"""

import dataclasses

import torch

from dynemb import _ops
from dynemb._host_reads import DeferredRead


@dataclasses.dataclass
class PaddedKeys:
    """``unique_keys`` of one table's keys, padded (``unique_keys_grouped_padded``).

    Attributes:
        unique: (n,) int64, the distinct keys in the first ``count()`` entries.
        inverse: (n,) int64, each index's position in ``unique``.
        counts: (n,) int64, each distinct key's occurrences (first ``count()`` entries).
        live: (1,) int64 on the keys' device, the number of distinct keys.
        read: the deferred read of the count (of every table of the call).
        part: this table's entry in ``read``.
    """

    unique: torch.Tensor
    inverse: torch.Tensor
    counts: torch.Tensor
    live: torch.Tensor
    read: DeferredRead
    part: int

    def count(self) -> int:
        """The number of distinct keys: read with the next read of the device (or now,
        counted, if none came since)."""
        return int(self.read.value()[self.part])

    def sized(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(unique (U,), inverse, counts (U,))``, as ``unique_keys`` returns them."""
        u = self.count()
        return self.unique[:u], self.inverse, self.counts[:u]


def padded_distinct_keys(keys: list[torch.Tensor]) -> list[PaddedKeys]:
    """``PaddedKeys`` of each tensor of ``keys`` (at least one), in one op call and no
    read of the device."""
    unique, inverse, counts, num_unique = _ops.unique_keys_grouped_padded(keys)
    read = DeferredRead(num_unique, "distinct count")
    return [
        PaddedKeys(u, i, c, num_unique[t : t + 1], read, t)
        for t, (u, i, c) in enumerate(zip(unique, inverse, counts, strict=True))
    ]
