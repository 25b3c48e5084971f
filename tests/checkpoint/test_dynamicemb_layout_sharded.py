"""A DynamicEmb-layout checkpoint written for 3 ranks loads into 2 gloo ranks (resharding,
continuous local ids turned back into keys), and dumps back in DynamicEmb's layout."""

import pytest
import torch

from dynemb.checkpoint import DynamicEmbDump, DynamicEmbLoad
from tests.support.checkpoint_workers import contents
from tests.support.dynamicemb_files import read_table, write_table
from tests.support.multiprocess import run_ranks
from tests.support.sharded_workers import NUM_EMBEDDINGS, Case, build_model

pytestmark = pytest.mark.no_emulated_pass(
    "file format over spawned ranks: readers and writers are Python"
)

KEYS = [0, 1, 13, 14, 26, 39, 40, 41, 1 << 40, -1, -7, (1 << 63) - 1]
DIMS = {"t0": 4, "t1": 8}


def _rows(dim: int, seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {
        k: (torch.randn(dim, generator=g).tolist(), torch.rand(2 * dim, generator=g).tolist(),
            [1000 * (i + 1)])
        for i, k in enumerate(KEYS)
    }  # fmt: skip


def _load_and_redump(rank, world_size, dist_type: str, path: str, redump: str):
    model = build_model(Case("ADAM", dist_type), world_size)
    DynamicEmbLoad(path, model, optim=True)
    loaded = contents(model)
    DynamicEmbDump(redump, model, optim=True, format="dynamicemb")
    return loaded


@pytest.mark.parametrize("dist_type", ["continuous"])
def test_load_a_three_rank_dynamicemb_checkpoint_on_two_ranks(tmp_path, dist_type):
    saved = {}
    for seed, (name, dim) in enumerate(DIMS.items()):
        saved[name] = _rows(dim, seed)
        args = {"opt_type": "adam", "lr": 0.05, "iters": 3, "beta1": 0.9, "beta2": 0.999,
                "eps": 1e-3, "weight_decay": 0.0, "evict_strategy": "EvictStrategy.KLru",
                "dist_type": dist_type, "step_score": 0}  # fmt: skip
        write_table(tmp_path / "ckpt" / "model", name, saved[name], 3, args, NUM_EMBEDDINGS)
    per_rank = run_ranks(
        _load_and_redump, 2, dist_type, str(tmp_path / "ckpt"), str(tmp_path / "back"),
        timeout=120,
    )  # fmt: skip
    for name, dim in DIMS.items():
        union = {}
        for rank_contents in per_rank:
            keys, rows, _ = rank_contents[name]
            for k, row in zip(keys.tolist(), rows.tolist()):
                assert k not in union, f"{name}: key {k} on two ranks"
                union[k] = row
        assert union == {k: v[0] + v[1] for k, v in saved[name].items()}
        back = read_table(tmp_path / "back" / "model", name, dim, 2 * dim, 1, dist_type,
                          NUM_EMBEDDINGS)  # fmt: skip
        assert {k: v[0] + v[1] for k, v in back.items()} == union
        assert sorted((tmp_path / "back" / "model").glob(f"{name}_emb_keys.*")) == [
            tmp_path / "back" / "model" / f"{name}_emb_keys.rank_{r}.world_size_2" for r in (0, 1)
        ]
