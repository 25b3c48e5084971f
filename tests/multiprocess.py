"""Runs a function on N real gloo ranks (spawned processes) with short timeouts.

``run_ranks(fn, world_size, *args)`` returns the list of ``fn(rank, world_size, *args)``
results. A rank that raises fails the call with its traceback; a rank still alive
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

import torch.distributed as dist
import torch.multiprocessing as mp

PG_TIMEOUT_S = 30  # a collective that waits longer fails inside the rank


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(fn, rank, world_size, port, out_dir, args) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    path = Path(out_dir) / f"rank{rank}.pkl"
    try:
        dist.init_process_group(
            "gloo",
            init_method=f"tcp://127.0.0.1:{port}",
            rank=rank,
            world_size=world_size,
            timeout=datetime.timedelta(seconds=PG_TIMEOUT_S),
        )
        try:
            result = ("ok", fn(rank, world_size, *args))
        finally:
            dist.destroy_process_group()
    except BaseException:  # noqa: BLE001 - reported to the parent, then exit nonzero
        result = ("error", traceback.format_exc())
    path.write_bytes(pickle.dumps(result))


def run_ranks(fn: Callable, world_size: int, *args, timeout: float = 180.0) -> list:
    """Runs ``fn(rank, world_size, *args)`` on ``world_size`` gloo ranks; returns the results."""
    ctx = mp.get_context("spawn")
    port = free_port()
    with tempfile.TemporaryDirectory() as out_dir:
        procs = [
            ctx.Process(target=_rank_main, args=(fn, r, world_size, port, out_dir, args))
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
