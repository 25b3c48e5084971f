"""dynemb._ops.emulation_counters(): what the emulated CUDA executor ran. One atomic
counts the launches and numbers them for the lane order (csrc/emulated/launch.cpp), so
a count is exact: a grid of g blocks of b threads adds 1 launch, g blocks, g * b threads.
The ops run in a fresh process with DYNEMB_EXECUTOR=cuda-emulated, whatever the pass."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.no_emulated_pass("runs its own process with the emulated executor")

ROOT = Path(__file__).resolve().parents[2]

_SCRIPT = """
import json, torch
from dynemb import _ops
seen = [_ops.emulation_counters()]
for n in (0, 1000, 1000):
    _ops.hash_keys(torch.arange(n, dtype=torch.int64), 64)
    seen.append(_ops.emulation_counters())
print(json.dumps(seen))
"""


def _counters(executor: str) -> list[dict[str, int]]:
    env = dict(os.environ, DYNEMB_EXECUTOR=executor)
    done = subprocess.run(
        [sys.executable, "-c", _SCRIPT], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def _step(seen, i):
    return {k: seen[i + 1][k] - seen[i][k] for k in seen[i]}


def test_each_emulated_op_adds_its_launches_blocks_and_threads():
    seen = _counters("cuda-emulated")
    assert seen[0] == {"launches": 0, "memsets": 0, "blocks": 0, "threads": 0, "host_reads": 0}
    first, second = _step(seen, 1), _step(seen, 2)
    assert first["launches"] >= 1
    assert first["threads"] >= first["blocks"] >= first["launches"]
    assert second == first, "the same op on the same sizes launches the same grids"
    assert all(_step(seen, i)[k] >= 0 for i in range(3) for k in seen[0])
    assert first["host_reads"] == 0, "hashing keys reads nothing back"


def test_the_cpu_executor_adds_nothing():
    seen = _counters("cpu")
    assert all(s == seen[0] for s in seen)


_UPSERT_SCRIPT = """
import json, sys, torch
from dynemb import _ops
from dynemb.table.scored_hash_table import ScoredHashTable
from dynemb import DynamicEmbScoreStrategy
strategy = getattr(DynamicEmbScoreStrategy, sys.argv[1])
table = ScoredHashTable(dim=64, capacity=1 << 14, score_strategy=strategy)
keys = torch.randint(0, 2**62, (4096,), generator=torch.Generator().manual_seed(0))
rows = torch.randn(keys.numel(), 64)
seen = [_ops.emulation_counters()]
for call in (lambda: table.find_or_insert(keys), lambda: table.find_or_insert(keys),
             lambda: table.insert_or_assign(keys, rows)):
    call()
    seen.append(_ops.emulation_counters())
print(json.dumps(seen))
"""


@pytest.mark.parametrize("strategy, launches", [("TIMESTAMP", 4), ("LFU", 4), ("NO_EVICTION", 9)])
def test_an_upsert_runs_its_launches_and_one_memset(strategy, launches):
    """find_or_insert (new keys, then hits) and insert_or_assign: the grouping by range
    (count, one-block scan, placement) and pass 1, which under an evicting strategy
    decides and counts every key; under NO_EVICTION also pass 0 (each key's bucket: its
    home or its second), the deferred list (count, scan, list) and pass 2; and the memset of the range counts (docs/gpu.md, "Launches per
    upsert")."""
    env = dict(os.environ, DYNEMB_EXECUTOR="cuda-emulated")
    done = subprocess.run(
        [sys.executable, "-c", _UPSERT_SCRIPT, strategy],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    for i in range(3):
        step = _step(seen, i)
        assert (step["launches"], step["memsets"]) == (launches, 1), f"call {i}: {step}"
