"""Rank-side code of tests/test_checkpoint_rank_faults.py: one rank fails inside a dump
(raises and stays alive, or is killed), the others must raise promptly, naming it."""

import errno
import os
import signal
import time

import torch

from dynemb.checkpoint import DynamicEmbDump
from dynemb.checkpoint import dump as dump_module
from dynemb.checkpoint.dump import committed_dump
from tests.checkpoint_tables import make_module, train

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
    except Exception as e:  # noqa: BLE001 - the outcome is the test's subject
        outcome = {"type": type(e).__name__, "error": str(e), "rank": getattr(e, "rank", None)}
    outcome.update(elapsed=time.monotonic() - start, first=first)
    if rank == failing:
        time.sleep(STAY_ALIVE_S)  # alive, out of every collective: nobody may wait for it
    return outcome
