"""DynamicEmbDump / DynamicEmbLoad on real gloo ranks: round trips, resharding to other
world sizes and dist_types, and training that continues as if never interrupted."""

import filecmp
import json
from pathlib import Path

import pytest
import torch

from dynemb.checkpoint.writer import committed_dump
from dynemb.distributed.routing import route_keys
from tests.support.checkpoint_workers import (
    dump_then_continue,
    load_then_continue,
    reshard,
    with_dist_type,
)
from tests.support.multiprocess import run_ranks
from tests.support.sharded_workers import NUM_EMBEDDINGS, Case

pytestmark = pytest.mark.no_emulated_pass(
    "spawned-rank dump, load and resharding: the CPU pass covers the protocol; the table ops they use are tested per executor elsewhere"
)

CASE = Case("ADAM", "roundrobin", "SUM")
BATCHES = [3, 5]
RESHARD_BATCHES = {1: [8], 4: [2, 3, 1, 2]}  # source world size -> per-rank batch sizes
RESHARD_TARGETS = [(1, "roundrobin"), (2, "roundrobin"), (3, "hash_roundrobin")]


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


def _assert_resharded(saved: list[dict], loaded: list[dict], dist_type: str) -> None:
    """Every saved key on exactly one rank, its owner, with its row, state and score."""
    world_size = len(loaded)
    for name in ["t0", "t1"]:
        want = _union(saved, name)
        got = _union(loaded, name)
        assert want[0].numel() > 0 and torch.equal(want[0], want[0].unique()), name
        assert torch.equal(got[0], want[0]), f"{name}: keys lost or duplicated"
        assert torch.equal(got[1], want[1]), f"{name}: rows (with optimizer state) differ"
        assert torch.equal(got[2], want[2]), f"{name}: scores differ"
        for rank, per_rank in enumerate(loaded):
            owner, _ = route_keys(per_rank[name][0], dist_type, world_size, NUM_EMBEDDINGS)
            assert bool((owner == rank).all()), f"{name}: a key on rank {rank} is not its owner"


@pytest.mark.parametrize("world_size", [1, 3])
def test_load_at_another_world_size_and_every_dist_type(dumped, world_size):
    path, saved, _ = dumped
    for dist_type in ["continuous", "roundrobin", "hash_roundrobin"]:
        case = with_dist_type(CASE, dist_type)
        results = run_ranks(load_then_continue, world_size, case, str(path), None, None)
        _assert_resharded(saved, [r[0] for r in results], dist_type)


def test_reshard_dumps_of_1_and_4_ranks_to_1_2_and_3(tmp_path):
    """A dump at 1 and one at 4 ranks, each loaded at 1, 2 and 3 ranks: four processes
    in all (one world, the sizes as groups of it), so that it stays quick on 2 cores.
    Rank 2 of 4 trains on one sample (a KJT whose lengths are a strided view)."""
    results = run_ranks(
        reshard, 4, CASE, str(tmp_path), RESHARD_BATCHES, RESHARD_TARGETS, timeout=120
    )
    for n in RESHARD_BATCHES:
        manifest = json.loads((tmp_path / f"from{n}" / "manifest.json").read_text())
        assert [len(t["files"]) for t in manifest["tables"].values()] == [n, n]
        saved = [results[r]["saved", n] for r in range(n)]
        for m, dist_type in RESHARD_TARGETS:
            loaded = [results[r]["loaded", n, m] for r in range(m)]
            _assert_resharded(saved, loaded, dist_type)


def test_manifest_names_a_complete_dump(dumped):
    path, _, _ = dumped
    dumps = [p for p in Path(path).iterdir() if p.is_dir()]
    assert [p.name for p in dumps] == [committed_dump(path)]
    manifest = json.loads((Path(path) / "manifest.json").read_text())
    assert sorted(manifest["tables"]) == ["t0", "t1"]  # no DMP wrapper level in names
    assert [f["rank"] for f in manifest["tables"]["t0"]["files"]] == [0, 1]
