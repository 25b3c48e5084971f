"""A kernel that fails names itself, its op and its table (csrc/cuda/launch_check.h).

Every launch of the CUDA executor is checked; on the emulated executor, which runs
each launch to its end as a GPU does under DYNEMB_CUDA_SYNC_LAUNCHES=1, a fault is
injected into the kernels whose source text contains DYNEMB_EMULATION_FAULT_KERNEL
(read once per process: each case runs in a fresh one). The error must reach Python
as a RuntimeError naming the kernel, the op and the table, and leave the table usable
for the next op; an empty step runs (its grids of 0 blocks, which CUDA refuses, are
skipped).
"""

import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.no_emulated_pass(
    "each case runs its own process on the emulated executor (DYNEMB_EXECUTOR is set there)"
)

SCRIPT = textwrap.dedent(
    """
    import torch, dynemb

    table = dynemb.ScoredHashTable(dim=8, capacity=1024, bucket_capacity=128)
    table.insert_or_assign(torch.arange(100), torch.ones(100, 8))
    module = dynemb.BatchedDynamicEmbeddingTables(
        [dynemb.DynamicEmbTableOptions(dim=8, max_capacity=1024)], [0]
    )
    empty = torch.empty(0, dtype=torch.int64)
    module(empty, torch.zeros(1, dtype=torch.int64)).sum().backward()  # an empty step
    print("EMPTY_STEP ok")
    try:
        table.find(torch.arange(10))
        print("NO_ERROR")
    except RuntimeError as e:
        print("ERROR", e)
    slots = table.find_slots(torch.tensor([1, 2, 500]))  # the next op still runs
    print("AFTER", (slots >= 0).tolist())
    """
)


def _run(fault: str) -> str:
    env = dict(os.environ, DYNEMB_EXECUTOR="cuda-emulated", DYNEMB_EMULATION_FAULT_KERNEL=fault)
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_a_faulting_kernel_names_itself_its_op_and_its_table():
    out = _run("find_kernel")
    error = next(line for line in out.splitlines() if line.startswith("ERROR"))
    assert "CUDA kernel `find_kernel<" in error
    assert "of op `table_find`" in error
    assert "on a table of 8 buckets x 128 slots, rows of 8 Float columns" in error
    assert "failed: an illegal memory access was encountered" in error
    assert "DYNEMB_CUDA_SYNC_LAUNCHES" not in error  # the emulator's launches are synced
    assert "AFTER [True, True, False]" in out.splitlines()


def test_without_a_fault_no_error_and_an_empty_step_runs():
    """An empty step's grids of 0 blocks are skipped (CUDA refuses them), not errors."""
    out = _run("")
    assert "NO_ERROR" in out.splitlines()
    assert "EMPTY_STEP ok" in out.splitlines()
