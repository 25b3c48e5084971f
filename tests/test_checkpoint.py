"""DynamicEmbDump / DynamicEmbLoad on real gloo ranks: round trips, resharding to other
world sizes and dist_types, and training that continues as if never interrupted."""

import filecmp
import json
from pathlib import Path

import pytest
import torch

from dynemb.checkpoint.dump import committed_dump
from dynemb.shard.routing import route_keys
from tests.checkpoint_workers import dump_then_continue, load_then_continue, with_dist_type
from tests.multiprocess import run_ranks
from tests.sharded_workers import NUM_EMBEDDINGS, Case

CASE = Case("ADAM", "roundrobin", "SUM")
BATCHES = [3, 5]


def _union(per_rank: list[dict], name: str):
    keys = torch.cat([r[name][0] for r in per_rank])
    rows = torch.cat([r[name][1] for r in per_rank])
    scores = torch.cat([r[name][2] for r in per_rank])
    order = torch.argsort(keys)
    return keys[order], rows[order], scores[order]


@pytest.fixture(scope="module")
def dumped(tmp_path_factory):
    path = tmp_path_factory.mktemp("ckpt") / "model"
    results = run_ranks(dump_then_continue, 2, CASE, str(path), BATCHES)
    return path, [r[0] for r in results], [r[1] for r in results]


def test_load_same_world_size_continues_training_and_redumps_identically(dumped, tmp_path):
    path, saved, continued = dumped
    redump = tmp_path / "again"
    results = run_ranks(load_then_continue, 2, CASE, str(path), BATCHES, str(redump))
    for rank in range(2):
        for step, (got, want) in enumerate(zip(results[rank][1], continued[rank], strict=True)):
            torch.testing.assert_close(got, want, atol=1e-6, rtol=0, msg=f"rank {rank} step {step}")
    a, b = path / committed_dump(path), redump / committed_dump(redump)
    names = sorted(p.name for p in a.iterdir())
    assert names == sorted(p.name for p in b.iterdir()) and names
    for name in names:
        assert filecmp.cmp(a / name, b / name, shallow=False), (
            f"{name} differs after dump -> load -> dump"
        )


@pytest.mark.parametrize("world_size", [1, 3])
def test_load_at_another_world_size_and_every_dist_type(dumped, world_size):
    path, saved, _ = dumped
    for dist_type in ["continuous", "roundrobin", "hash_roundrobin"]:
        case = with_dist_type(CASE, dist_type)
        results = run_ranks(load_then_continue, world_size, case, str(path), None, None)
        loaded = [r[0] for r in results]
        for name in ["t0", "t1"]:
            want = _union(saved, name)
            got = _union(loaded, name)
            assert torch.equal(got[0], want[0]), f"{name}: keys lost or duplicated"
            assert torch.equal(got[1], want[1]), f"{name}: rows (with optimizer state) differ"
            assert torch.equal(got[2], want[2]), f"{name}: scores differ"
            for rank, per_rank in enumerate(loaded):
                owner, _ = route_keys(per_rank[name][0], dist_type, world_size, NUM_EMBEDDINGS)
                assert bool((owner == rank).all()), f"{name}: a key on rank {rank} is not its owner"


def test_manifest_names_a_complete_dump(dumped):
    path, _, _ = dumped
    dumps = [p for p in Path(path).iterdir() if p.is_dir()]
    assert [p.name for p in dumps] == [committed_dump(path)]
    manifest = json.loads((Path(path) / "manifest.json").read_text())
    assert sorted(manifest["tables"]) == ["t0", "t1"]  # no DMP wrapper level in names
    assert [f["rank"] for f in manifest["tables"]["t0"]["files"]] == [0, 1]
