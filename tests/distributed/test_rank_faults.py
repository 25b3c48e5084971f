"""A rank that fails inside a load, an incremental dump or collective planning: every
other rank raises RankFailure naming it and its error within a bounded time (at once
for a rank that raised and stayed alive, within ``fault_timeout`` for one killed),
never a gloo transport error nor a wait of the process-group timeout.
(The dump's faults: tests/checkpoint/test_checkpoint_rank_faults.py.)"""

import pytest

from tests.support.checkpoint_fault_workers import (
    FAULT_TIMEOUT_S,
    STAY_ALIVE_S,
    incremental_dump_with_a_fault,
    load_with_a_fault,
    plan_with_a_fault,
)
from tests.support.multiprocess import run_ranks

pytestmark = pytest.mark.no_emulated_pass(
    "spawned gloo ranks: the fault protocol is Python and process code, run in the CPU pass"
)


def _named(r: dict, failing: int, world_size: int, fault: str, error: str) -> None:
    """``r`` is a RankFailure naming rank ``failing`` (and, for a raise, its error)."""
    assert r["type"] == "RankFailure", r
    if fault == "raise":
        assert r["rank"] == failing, r
        assert f"rank {failing} of {world_size} failed" in r["error"] and error in r["error"], r
        assert r["elapsed"] < STAY_ALIVE_S / 2, r
        return
    # Killed: "rank r of W stopped responding", or for rank 0, which hosts the process
    # group's store, "the process group's store is unreachable ... rank 0".
    assert f"rank {failing} of {world_size} stopped responding" in r["error"] or (
        failing == 0 and "store is unreachable" in r["error"] and "rank 0" in r["error"]
    ), r
    assert r["elapsed"] < 2 * FAULT_TIMEOUT_S + 5, r


@pytest.mark.parametrize("world_size, failing, fault", [(2, 1, "raise"), (3, 2, "kill")])
def test_a_rank_that_fails_during_a_load(tmp_path, world_size, failing, fault):
    expect_dead = (failing,) if fault == "kill" else ()
    results = run_ranks(
        load_with_a_fault,
        world_size,
        str(tmp_path / "ckpt"),
        failing,
        fault,
        timeout=120,
        expect_dead=expect_dead,
    )
    for rank, r in enumerate(results):
        if rank == failing:
            assert fault == "kill" or "injected: restoring rows failed" in r["error"], r
            continue
        _named(r, failing, world_size, fault, "RuntimeError: injected: restoring rows failed")


def test_a_rank_that_fails_during_an_incremental_dump():
    results = run_ranks(incremental_dump_with_a_fault, 2, 1, "raise", timeout=120)
    assert "injected: reading the table failed" in results[1]["error"]
    _named(results[0], 1, 2, "raise", "RuntimeError: injected: reading the table failed")


@pytest.mark.parametrize("fault", ["raise", "kill"])
def test_rank_zero_fails_while_planning(fault):
    expect_dead = (0,) if fault == "kill" else ()
    results = run_ranks(plan_with_a_fault, 2, fault, timeout=120, expect_dead=expect_dead)
    if fault == "raise":  # rank 0's own error is the planner's
        assert results[0]["type"] == "PlannerError", results[0]
    _named(results[1], 0, 2, fault, "PlannerError")
