"""Rank-side code of tests/compat/test_dump_load_helpers.py and test_v2_members_sharded.py."""

import torch
import torch.distributed as dist
from torch import nn
from torchrec.distributed.embeddingbag import ShardedEmbeddingBagCollection

from dynemb.batched_dynamicemb_tables import BatchedDynamicEmbeddingTablesV2
from dynemb.dump_load import find_sharded_modules, get_dynamic_emb_module
from tests.support.sharded_workers import Case, build_model, global_batch, local_kjt

CASE = Case("EXACT_SGD", "roundrobin")


class Outer(nn.Module):
    """A model whose sharded collection sits at ``sparse.ebc``."""

    def __init__(self, ebc: nn.Module) -> None:
        super().__init__()
        self.sparse = nn.Module()
        self.sparse.ebc = ebc


def train(model, rank: int, world_size: int, steps: int = 2) -> None:
    batch = 2
    for step in range(steps):
        lengths, keys, _ = global_batch(step, batch * world_size, False)
        kjt = local_kjt(lengths, keys, None, rank * batch, (rank + 1) * batch)
        model(kjt).values().sum().backward()


def helpers(rank: int, world_size: int) -> dict:
    """find_sharded_modules / get_dynamic_emb_module over a DMP model and a nested one."""
    model = build_model(CASE, world_size)
    found = find_sharded_modules(model)
    modules = get_dynamic_emb_module(model)
    sharded = found[0][2]
    nested = find_sharded_modules(Outer(sharded))
    prefixed = find_sharded_modules(Outer(sharded), "net")
    return {
        "found": [(p, n, isinstance(m, ShardedEmbeddingBagCollection)) for p, n, m in found],
        "nested": [(p, n, m is sharded) for p, n, m in nested],
        "prefixed": [(p, n) for p, n, _ in prefixed],
        "modules": [
            (type(m) is BatchedDynamicEmbeddingTablesV2, list(m.table_names)) for m in modules
        ],
        "plain": find_sharded_modules(nn.Linear(2, 2)) + get_dynamic_emb_module(nn.Linear(2, 2)),
    }


def module_members(rank: int, world_size: int, path: str) -> dict:
    """A sharded model's V2 module: incremental_dump gathered over the world, dump and load
    of this module's tables with the world's ranks."""
    model = build_model(CASE, world_size)
    (tables,) = get_dynamic_emb_module(model)
    ref = tables.get_score()
    train(model, rank, world_size)
    mine, _ = tables.incremental_dump(ref)
    gathered, new_ref = tables.incremental_dump(ref, pg=dist.group.WORLD)
    tables.dump(path, optim=True, pg=dist.group.WORLD)
    fresh_model = build_model(CASE, world_size)
    (fresh,) = get_dynamic_emb_module(fresh_model)
    fresh.load(path, optim=True, pg=dist.group.WORLD)
    exported = {n: tables.export_keys_values(n, torch.device("cpu")) for n in tables.table_names}
    reloaded = {n: fresh.export_keys_values(n, torch.device("cpu")) for n in fresh.table_names}
    return {
        "mine": mine,
        "gathered": gathered,
        "new_ref": new_ref,
        "exported": exported,
        "reloaded": reloaded,
    }
