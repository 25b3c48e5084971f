"""DYNAMICEMB_API.md section 13: BatchedDynamicEmbeddingTablesV2's members on the module
of a sharded model (reached through get_dynamic_emb_module), over 1 and 2 gloo ranks:
incremental_dump gathered with ``pg``, dump and load of the module's tables."""

import pytest
import torch

from tests.support.dump_load_workers import module_members
from tests.support.multiprocess import run_ranks

pytestmark = pytest.mark.no_emulated_pass(
    "members of a sharded module over spawned gloo ranks: Python; the table ops are tested per executor elsewhere"
)


def _sorted(keys: torch.Tensor, values: torch.Tensor):
    order = keys.argsort()
    return keys[order], values[order]


@pytest.mark.parametrize("world_size", [1, 2])
def test_module_members_of_a_sharded_model(tmp_path, world_size):
    results = run_ranks(module_members, world_size, str(tmp_path / "ckpt"), timeout=170)
    for name in ("t0", "t1"):
        every_rank = torch.cat([r["mine"][name][0] for r in results])
        for r in results:
            gathered = r["gathered"][name][0]
            assert sorted(gathered.tolist()) == sorted(every_rank.tolist())
            assert r["gathered"][name][1].shape == (gathered.numel(), 8 if name == "t1" else 4)
            assert set(r["new_ref"]) == {"t0", "t1"}
            saved_keys, saved_rows = _sorted(*r["exported"][name])
            loaded_keys, loaded_rows = _sorted(*r["reloaded"][name])
            assert torch.equal(saved_keys, loaded_keys) and torch.equal(saved_rows, loaded_rows)
        assert every_rank.numel() > 0
