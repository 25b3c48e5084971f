"""``hash_roundrobin``'s owner rank, DynamicEmb's rule: ``fmix64(uint64(key)) % world_size``.

fmix64 is MurmurHash3's 64-bit finaliser, unsalted, so code that pre-routes ids as
DynamicEmb does (data loaders, custom input dists) agrees with dynemb's sharding.

Why a rank's keys still spread over all of its buckets: a table takes a key's bucket
from the high 32 bits of the same hash, by multiply-shift (csrc/core/hash.h). For a
power-of-two world size the owner is the hash's low bits, independent of the high
ones; for another world size the residue modulo ``world_size`` leaves the high bits
nearly uniform. What the owner fixes, for a power-of-two world size, is the low
``log2(world_size)`` bits of the slot digest (the hash's low byte): a rank's digests
take ``256 / world_size`` values, so bucket scans compare a key a little more often.
"""

import torch

_C1 = 0xFF51AFD7ED558CCD
_C2 = 0xC4CEB9FE1A85EC53
_LOW31 = (1 << 31) - 1  # the bits left by a logical right shift of 33


def _as_int64(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


def fmix64(keys: torch.Tensor) -> torch.Tensor:
    """MurmurHash3's fmix64 of each key read as uint64; (n,) int64 holding the uint64 bits.

    Example::

        fmix64(torch.tensor([1]))  # tensor([-5451962507482445012]), the bits of 0xb456bcfc34c2cb2c
    """
    k = keys.to(torch.int64)
    k = k ^ ((k >> 33) & _LOW31)
    k = k * _as_int64(_C1)
    k = k ^ ((k >> 33) & _LOW31)
    k = k * _as_int64(_C2)
    return k ^ ((k >> 33) & _LOW31)


def unsigned_remainder(values: torch.Tensor, divisor: int) -> torch.Tensor:
    """``uint64(values) % divisor`` for int64 ``values`` and ``1 <= divisor < 2**63``."""
    rem = torch.remainder(values, divisor)
    wrap = (1 << 64) % divisor  # a negative value stands for value + 2**64
    return torch.where(values < 0, torch.remainder(rem + wrap, divisor), rem)


def hash_roundrobin_ranks(keys: torch.Tensor, world_size: int) -> torch.Tensor:
    """Owner rank of each key under ``hash_roundrobin``: (n,) int64 in [0, world_size)."""
    return unsigned_remainder(fmix64(keys), world_size)


__all__ = ["fmix64", "hash_roundrobin_ranks", "unsigned_remainder"]
