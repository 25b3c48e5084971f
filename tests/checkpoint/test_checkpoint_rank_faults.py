"""A rank that fails during a multi-process dump: every other rank raises RankFailure
naming it (and its error) within a bounded time, never a gloo "Connection reset by
peer" nor a wait of the process-group timeout; nothing is committed and the previous
checkpoint stays the committed one."""

import pytest

from dynemb.checkpoint import DynamicEmbDump, DynamicEmbLoad
from dynemb.checkpoint.writer import committed_dump
from tests.support.checkpoint_fault_workers import FAULT_TIMEOUT_S, STAY_ALIVE_S, dump_with_a_fault
from tests.support.checkpoint_tables import contents, make_module, same
from tests.support.multiprocess import run_ranks

pytestmark = pytest.mark.no_emulated_pass(
    "spawned gloo ranks: the fault protocol is Python and process code, run in the CPU pass"
)


def _dump_dirs(path) -> list[str]:
    return sorted(p.name for p in path.iterdir() if p.is_dir())


def _previous_checkpoint_intact(path, first: str) -> None:
    assert committed_dump(path) == first
    module = make_module()
    DynamicEmbLoad(path, module, optim=True)  # every saved rank's rows load
    again = make_module()
    DynamicEmbDump(path, module, optim=True, allow_overwrite=True)  # and the next dump works
    DynamicEmbLoad(path, again, optim=True)
    assert same(contents(again), contents(module))
    assert _dump_dirs(path) == [committed_dump(path)]


@pytest.mark.parametrize("world_size, failing", [(2, 1), (3, 1), (3, 0)])
def test_a_rank_that_raises_and_stays_alive(tmp_path, world_size, failing):
    path = tmp_path / "ckpt"
    results = run_ranks(dump_with_a_fault, world_size, str(path), failing, "raise", timeout=120)
    for rank, r in enumerate(results):
        if rank == failing:
            assert r["type"] == "OSError" and "No space left" in r["error"]
            continue
        assert r["type"] == "RankFailure", r
        assert r["rank"] == failing
        assert f"rank {failing} of {world_size} failed: OSError" in r["error"]
        assert "No space left" in r["error"]
        assert r["elapsed"] < STAY_ALIVE_S / 2, f"rank {rank} waited {r['elapsed']:.1f} s"
    _previous_checkpoint_intact(path, results[failing]["first"])


@pytest.mark.parametrize("world_size, failing", [(2, 1), (3, 2), (3, 0)])
def test_a_rank_killed_during_the_dump(tmp_path, world_size, failing):
    path = tmp_path / "ckpt"
    results = run_ranks(
        dump_with_a_fault,
        world_size,
        str(path),
        failing,
        "kill",
        timeout=120,
        expect_dead=(failing,),
    )
    assert results[failing] is None, "the killed rank reported a result"
    for rank, r in enumerate(results):
        if rank == failing:
            continue
        assert r["type"] == "RankFailure", r
        assert r["rank"] == failing, r
        # Named: "rank r of W stopped responding", or for rank 0, which hosts the
        # process group's store, "the process group's store is unreachable ... rank 0".
        assert f"rank {failing} of {world_size} stopped responding" in r["error"] or (
            failing == 0 and "store is unreachable" in r["error"] and "rank 0" in r["error"]
        ), r["error"]
        assert r["elapsed"] < FAULT_TIMEOUT_S + 5, f"rank {rank} waited {r['elapsed']:.1f} s"
    first = next(r["first"] for r in results if r is not None)
    _previous_checkpoint_intact(path, first)
