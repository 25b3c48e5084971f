"""collective_plan on 2 real gloo ranks: every rank gets rank 0's plan.

Rank 1 builds its planner with other options (bucket_capacity 64, not 128): it can
only end up with rank 0's values if the plan was broadcast. A rank that hangs is
killed at the join deadline and the test fails.
"""

import datetime
import os
import pickle
import socket
import tempfile
import traceback
from pathlib import Path

import torch.distributed as dist
import torch.multiprocessing as mp

from dynemb import DynamicEmbTableOptions
from dynemb.planner import DynamicEmbeddingShardingPlanner, DynamicEmbParameterConstraints
from tests.test_planner import Model, all_configs, cpu_topology, entries, sharders

WORLD_SIZE = 2
PG_TIMEOUT_S = 30
JOIN_TIMEOUT_S = 120
RANK_BUCKET = {0: 128, 1: 64}


def _plan_on_rank(rank: int, port: int, out: str) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    try:
        dist.init_process_group(
            "gloo",
            init_method=f"tcp://127.0.0.1:{port}",
            rank=rank,
            world_size=WORLD_SIZE,
            timeout=datetime.timedelta(seconds=PG_TIMEOUT_S),
        )
        try:
            options = DynamicEmbTableOptions(bucket_capacity=RANK_BUCKET[rank])
            constraints = {
                "user": DynamicEmbParameterConstraints(
                    use_dynamicemb=True, dynamicemb_options=options
                )
            }
            planner = DynamicEmbeddingShardingPlanner(
                all_configs(),
                topology=cpu_topology(WORLD_SIZE),
                constraints=constraints,
                debug=False,
            )
            result = ("ok", planner.collective_plan(Model(), sharders()))
        finally:
            dist.destroy_process_group()
    except BaseException:  # noqa: BLE001 - reported to the test
        result = ("error", traceback.format_exc())
    Path(out, f"rank{rank}.pkl").write_bytes(pickle.dumps(result))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_collective_plan_broadcasts_rank_zero_plan():
    ctx = mp.get_context("spawn")
    port = _free_port()
    with tempfile.TemporaryDirectory() as out:
        procs = [
            ctx.Process(target=_plan_on_rank, args=(rank, port, out)) for rank in range(WORLD_SIZE)
        ]
        for p in procs:
            p.start()
        for p in procs:
            p.join(JOIN_TIMEOUT_S)
        hung = [rank for rank, p in enumerate(procs) if p.is_alive()]
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()
        assert not hung, f"ranks {hung} hung in collective_plan"
        results = [
            pickle.loads(Path(out, f"rank{rank}.pkl").read_bytes()) for rank in range(WORLD_SIZE)
        ]
    for rank, (status, value) in enumerate(results):
        assert status == "ok", f"rank {rank} failed:\n{value}"
    plans = [entries(value) for _, value in results]
    assert plans[0] == plans[1]
    for plan in plans:
        # 1000 rows on 2 ranks with rank 0's 128-slot buckets: 512 rows per rank.
        options = plan["user"].dynamicemb_options
        assert (options.bucket_capacity, options.max_capacity) == (128, 512)
