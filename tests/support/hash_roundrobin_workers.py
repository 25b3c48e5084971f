"""Rank-side code of tests/compat/test_hash_roundrobin.py."""

import torch

from dynemb.checkpoint import DynamicEmbDump, DynamicEmbLoad
from dynemb.dump_load import get_dynamic_emb_module
from tests.support.sharded_workers import Case, build_model

CASE = Case("EXACT_SGD", "hash_roundrobin")
_OLD_SALT = 0x5BD1E9955BD1E995  # the routing of earlier dynemb versions
_U64 = (1 << 64) - 1


def _old_fmix64(k: int) -> int:
    """MurmurHash3's 64-bit finaliser, as the earlier versions' routing hashed a key:
    written out here, so that the old owners stay the old ones whatever the C++ hash
    becomes."""
    k ^= k >> 33
    k = (k * 0xFF51AFD7ED558CCD) & _U64
    k ^= k >> 33
    k = (k * 0xC4CEB9FE1A85EC53) & _U64
    return k ^ (k >> 33)


def old_owner(keys: torch.Tensor, world_size: int) -> torch.Tensor:
    """The rank earlier dynemb versions sent a hash_roundrobin key to: the high 32 bits
    of fmix64(key ^ salt), scaled to [0, world_size)."""
    owners = [
        ((_old_fmix64((k & _U64) ^ _OLD_SALT) >> 32) * world_size) >> 32 for k in keys.tolist()
    ]
    return torch.tensor(owners, dtype=torch.int64)


def saved_keys() -> torch.Tensor:
    return torch.randint(-(1 << 62), 1 << 62, (100,), generator=torch.Generator().manual_seed(5))


def dump_old_routing(rank: int, world_size: int, path: str, fmt: str) -> None:
    """A checkpoint as an earlier version wrote it: each rank holds the keys the salted
    routing gave it, each row filled with its key (as a float)."""
    model = build_model(CASE, world_size)
    (tables,) = get_dynamic_emb_module(model)
    keys = saved_keys()
    mine = keys[old_owner(keys, world_size) == rank]
    for table in tables.tables:
        rows = mine.to(torch.float32).unsqueeze(1).expand(-1, table.dim).contiguous()
        table.insert_or_assign(mine, rows)
    DynamicEmbDump(path, model, format=fmt)


def load_new_routing(rank: int, world_size: int, path: str) -> dict:
    """Loads that checkpoint into a fresh model: what this rank then holds, per table."""
    model = build_model(CASE, world_size)
    DynamicEmbLoad(path, model)
    (tables,) = get_dynamic_emb_module(model)
    out = {}
    for name in tables.table_names:
        keys, rows = tables.export_keys_values(name, torch.device("cpu"))
        out[name] = (keys, rows[:, 0])
    return out
