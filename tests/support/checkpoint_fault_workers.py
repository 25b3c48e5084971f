"""Rank-side code of tests/checkpoint/test_checkpoint_rank_faults.py and tests/distributed/test_rank_faults.py:
one rank fails inside a dump, a load, an incremental dump or collective planning
(raises and stays alive, or is killed), the others must raise promptly, naming it."""

import errno
import os
import signal
import time

import torch

from dynemb.checkpoint import DynamicEmbDump, DynamicEmbLoad
from dynemb.checkpoint import writer as dump_module
from dynemb.checkpoint.writer import committed_dump
from tests.support.checkpoint_tables import make_module, train

FAULT_TIMEOUT_S = 3.0
STAY_ALIVE_S = 8.0  # a rank that caught its error lives on this long


def dump_with_a_fault(rank: int, world_size: int, path: str, failing: int, fault: str) -> dict:
    """Dumps once cleanly, then again with ``fault`` ("raise" or "kill") on rank
    ``failing``; returns what the second dump raised here and how long it took."""
    torch.manual_seed(rank)
    module = make_module()
    train(module, torch.arange(rank * 1000, rank * 1000 + 400))
    DynamicEmbDump(path, module, optim=True, fault_timeout=FAULT_TIMEOUT_S)
    first = committed_dump(path)
    train(module, torch.arange(0, 300))
    if rank == failing:
        real = dump_module._write_table

        def failing_write(*args, **kwargs):
            real(*args, **kwargs)  # some files written, then the fault
            if fault == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            raise OSError(errno.ENOSPC, f"DynamicEmbDump: writing {path}/x failed: No space left")

        dump_module._write_table = failing_write
    start = time.monotonic()
    try:
        DynamicEmbDump(
            path, module, optim=True, allow_overwrite=True, fault_timeout=FAULT_TIMEOUT_S
        )
        outcome = {"error": None}
    except Exception as e:  # the outcome is the test's subject
        outcome = {"type": type(e).__name__, "error": str(e), "rank": getattr(e, "rank", None)}
    outcome.update(elapsed=time.monotonic() - start, first=first)
    if rank == failing:
        time.sleep(STAY_ALIVE_S)  # alive, out of every collective: nobody may wait for it
    return outcome


def _fault(fault: str, what: str):
    """A replacement for a rank's step that fails with ``fault``."""

    def failing(*args, **kwargs):
        if fault == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        raise RuntimeError(f"injected: {what} failed")

    return failing


def _outcome(call, rank: int, failing: int) -> dict:
    """What ``call()`` raised here and how long it took; the failing rank then stays
    alive, out of every collective, for STAY_ALIVE_S."""
    start = time.monotonic()
    try:
        call()
        outcome = {"error": None}
    except Exception as e:  # the outcome is the test's subject
        outcome = {"type": type(e).__name__, "error": str(e), "rank": getattr(e, "rank", None)}
    outcome["elapsed"] = time.monotonic() - start
    if rank == failing:
        time.sleep(STAY_ALIVE_S)
    return outcome


def load_with_a_fault(rank: int, world_size: int, path: str, failing: int, fault: str) -> dict:
    """Dumps, then loads with ``fault`` on rank ``failing`` while it restores rows."""
    from dynemb.checkpoint import load as load_module

    module = make_module()
    train(module, torch.arange(rank * 1000, rank * 1000 + 400))
    DynamicEmbDump(path, module, optim=True, fault_timeout=FAULT_TIMEOUT_S)
    if rank == failing:
        load_module.restore_rows = _fault(fault, "restoring rows")
    target = make_module()
    return _outcome(
        lambda: DynamicEmbLoad(path, target, optim=True, fault_timeout=FAULT_TIMEOUT_S),
        rank,
        failing,
    )


def incremental_dump_with_a_fault(rank: int, world_size: int, failing: int, fault: str) -> dict:
    """incremental_dump over the group with ``fault`` on rank ``failing``."""
    import dynemb.checkpoint.incremental as incremental

    module = make_module()
    train(module, torch.arange(rank * 1000, rank * 1000 + 400))
    if rank == failing:
        incremental._dump_table = _fault(fault, "reading the table")
    group = torch.distributed.group.WORLD
    return _outcome(
        lambda: incremental.incremental_dump(module, 0, group, fault_timeout=FAULT_TIMEOUT_S),
        rank,
        failing,
    )


def plan_with_a_fault(rank: int, world_size: int, fault: str) -> dict:
    """collective_plan where rank 0 cannot plan: its topology has 1 KiB of DDR per
    rank (a real PlannerError), or it is killed while planning."""
    from dynemb.planner import DynamicEmbeddingShardingPlanner
    from tests.support.planner_models import Model, all_configs, cpu_topology, sharders

    topology = cpu_topology(world_size, ddr_cap=1024 if rank == 0 else None)
    planner = DynamicEmbeddingShardingPlanner(all_configs(), topology=topology, debug=False)
    if rank == 0 and fault == "kill":
        planner._plan = _fault(fault, "planning")  # collective_plan plans through it
    return _outcome(
        lambda: planner.collective_plan(Model(), sharders(), fault_timeout=FAULT_TIMEOUT_S),
        rank,
        0,
    )
