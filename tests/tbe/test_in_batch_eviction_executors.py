"""Batches with more distinct keys than the table holds train the same bits on every
executor: the CPU executor and the CUDA kernels (run on host threads by the emulated
executor) store the same keys with the same rows and optimizer state.

Each executor is chosen at import (DYNEMB_EXECUTOR), so each run is a fresh process.
Before pins, keys evicted by their own batch trained on their evictor's row, and the
order of that parallel sum changed from run to run on the CUDA kernels.
"""

import os
import subprocess
import sys

import pytest
import torch

CASES = [
    ("EXACT_SGD", "SUM", False),  # the reproducer: no key repeats much
    ("EXACT_SGD", "MEAN", True),
    ("EXACT_ROWWISE_ADAGRAD", "MEAN", True),
    ("ADAM", "MEAN", True),
    ("EXACT_ADAGRAD", "NONE", True),
    ("FTRL", "MEAN", True),
]


def train_and_save(optimizer: str, pooling: str, hot: bool) -> dict:
    """12 steps of 2,000 random keys in bags of 4 into a 256-row table (bucket 128);
    ``hot``: every third index is one key. Returns the table sorted by key."""
    import dynemb
    from dynemb import DynamicEmbCheckMode, DynamicEmbPoolingMode, DynamicEmbTableOptions
    from dynemb.optimizer import optimizer_type_of

    options = DynamicEmbTableOptions(
        dim=8, max_capacity=256, bucket_capacity=128,
        safe_check_mode=DynamicEmbCheckMode.IGNORE, seed=1,
    )  # fmt: skip
    module = dynemb.BatchedDynamicEmbeddingTables(
        [options], [0], pooling_mode=getattr(DynamicEmbPoolingMode, pooling),
        optimizer=optimizer_type_of(optimizer), learning_rate=0.1,
        **({"l1_reg": 0.01, "ftrl_beta": 1.0, "learning_rate_power": -0.4,
            "initial_accumulator_value": 0.1} if optimizer == "FTRL" else {}),
    )  # fmt: skip
    gen = torch.Generator().manual_seed(0)
    for _ in range(12):
        keys = torch.randint(0, 1 << 40, (2000,), generator=gen)
        if hot:
            keys[::3] = 7
        module(keys, torch.arange(0, 2001, 4)).sum().backward()
    table = module.tables[0]
    keys, values, _, _ = table.export_batch(0, table.capacity())
    order = keys.argsort()
    return {"executor": dynemb.executor(), "keys": keys[order], "values": values[order]}


def train_every_case(path: str) -> None:
    """Every case in this process (one import of the executor), saved to ``path``."""
    torch.save([train_and_save(*case) for case in CASES], path)


def _run(executor: str, path) -> list[dict]:
    """Every case trained on ``executor``, in a fresh process."""
    env = {**os.environ, "DYNEMB_EXECUTOR": executor}
    code = (
        "from tests.tbe.test_in_batch_eviction_executors import train_every_case; "
        f"train_every_case({str(path)!r})"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    saved = torch.load(path)
    assert all(s["executor"] == executor for s in saved)
    return saved


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> dict[str, list[dict]]:
    path = tmp_path_factory.mktemp("in_batch_eviction")
    return {e: _run(e, path / f"{e}.pt") for e in ("cpu", "cuda-emulated")}


@pytest.mark.no_emulated_pass("runs both executors itself, each in its own process")
@pytest.mark.parametrize("case", CASES, ids=["-".join(map(str, c)) for c in CASES])
def test_overflowing_batches_train_the_same_bits_on_every_executor(trained, case):
    cpu, emulated = (trained[e][CASES.index(case)] for e in ("cpu", "cuda-emulated"))
    assert cpu["keys"].numel() == 256
    assert torch.equal(cpu["keys"], emulated["keys"])
    differing = (cpu["values"] != emulated["values"]).any(dim=1).sum()
    assert int(differing) == 0, f"{int(differing)} of 256 rows differ"
