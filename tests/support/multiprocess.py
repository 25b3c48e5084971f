"""Runs a function on N real ranks (processes of their own) with short timeouts.

``run_ranks(fn, world_size, *args)`` returns the list of ``fn(rank, world_size, *args)``
results. The ranks' backend is ``tests.support.devices.process_group_backend``: gloo for ranks
on CPU tensors (every worker today), NCCL for ranks on ``device="cuda"`` when the cuda
test device is on and every rank has a GPU (rank r then runs on ``cuda:r``; a worker
reads its device from ``rank_device()``). A rank that raises fails the call with its traceback; a rank still alive
at the deadline (a hang in a collective) is killed and the call fails: a hang
costs ``timeout`` seconds, never the whole CI run.
"""

import datetime
import os
import pickle
import socket
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from tests.support.devices import process_group_backend

PG_TIMEOUT_S = 30  # a collective that waits longer fails inside the rank
# Ranks are forked from a server process that imported these once (the forkserver start
# method, preloaded): a freshly spawned rank spends ~5 CPU-seconds importing them each
# time. The server starts on the first call and keeps this process's environment and
# sys.path (DYNEMB_EXECUTOR included: dynemb reads it at import).
_PRELOAD = [
    "torch",
    "torch.distributed",
    "torchrec",
    "dynemb",
    "dynemb.shard",
    "tests.support.multiprocess",
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_device() -> torch.device:
    """The device of this rank's tensors: ``cuda:<rank>`` in an NCCL group, else CPU."""
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _rank_main(fn, rank, world_size, port, out_dir, device, args) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    path = Path(out_dir) / f"rank{rank}.pkl"
    try:
        backend = process_group_backend(world_size, device)
        if backend == "nccl":
            torch.cuda.set_device(rank)
        dist.init_process_group(
            backend,
            init_method=f"tcp://127.0.0.1:{port}",
            rank=rank,
            world_size=world_size,
            timeout=datetime.timedelta(seconds=PG_TIMEOUT_S),
        )
        try:
            result = ("ok", fn(rank, world_size, *args))
        finally:
            dist.destroy_process_group()
    except BaseException:  # reported to the parent, then exit nonzero
        result = ("error", traceback.format_exc())
    path.write_bytes(pickle.dumps(result))


def run_ranks(
    fn: Callable,
    world_size: int,
    *args,
    timeout: float = 180.0,
    device: str = "cpu",
    expect_dead: tuple[int, ...] = (),
) -> list:
    """Runs ``fn(rank, world_size, *args)`` on ``world_size`` ranks; returns the results.

    Args:
        fn: the rank's work (a module-level function: ranks are spawned).
        world_size: number of ranks.
        *args: passed to ``fn`` after ``rank, world_size``.
        timeout: seconds before a rank still running is killed and the call fails.
        device: device type ``fn`` puts its tensors on (see ``rank_device``); it picks
            the backend (``process_group_backend``).
        expect_dead: ranks that are meant to die (a fault test kills them): their
            result is None instead of an error.
    """
    if os.environ.get("DYNEMB_SKIP_SPAWNED_RANKS") == "1":
        # `make sanitize-asan` sets it: ranks under AddressSanitizer are slow (ASAN_SPAWNED=1 runs them).
        pytest.skip("spawned ranks are off in this run (DYNEMB_SKIP_SPAWNED_RANKS=1)")
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(_PRELOAD)
    port = free_port()
    with tempfile.TemporaryDirectory() as out_dir:
        procs = [
            ctx.Process(target=_rank_main, args=(fn, r, world_size, port, out_dir, device, args))
            for r in range(world_size)
        ]
        for p in procs:
            p.start()
        deadline = time.monotonic() + timeout
        for p in procs:
            p.join(max(0.0, deadline - time.monotonic()))
        hung = [r for r, p in enumerate(procs) if p.is_alive()]
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()
        results, errors = [], []
        for r in range(world_size):
            path = Path(out_dir) / f"rank{r}.pkl"
            if not path.exists() and r in expect_dead and r not in hung:
                results.append(None)
                continue
            if not path.exists():
                why = "hung (killed at the deadline)" if r in hung else "died without a result"
                errors.append(f"rank {r} of {world_size} {why}")
                continue
            status, value = pickle.loads(path.read_bytes())
            if status != "ok":
                errors.append(f"rank {r} of {world_size} failed:\n{value}")
            results.append(value)
        if errors:  # every rank's story: the first failure makes the others fail too
            raise RuntimeError("\n".join(errors))
        return results
