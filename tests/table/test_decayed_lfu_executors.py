"""DECAYED_LFU on every executor gives the same bits: the CPU executor (1 and 2 threads),
the emulated CUDA executor and, with a GPU, the CUDA executor, run on copies of one
table (tests/csrc/test_executor_parity.py's harness), over batches that fill, evict and
count repeated keys; and the scores are the oracle's (tests/support/decay_reference.py)."""

from functools import partial

import pytest
import torch

from dynemb import _ops
from tests.support import decay_reference as decay
from tests.support import reference as ref
from tests.support.executor_parity import (
    assign_outputs,
    claim_outputs,
    find_or_insert_outputs,
    key_batches,
    run_on_every_executor,
)

pytestmark = pytest.mark.no_emulated_pass(
    "runs the CPU and the emulated executor side by side itself: the same run in both passes"
)

DIM, ROW = 4, 7  # the parity harness's row layout
HALF_LIFE = 3


def parity_table(strategy, num_buckets, bucket_capacity=16):
    slots = num_buckets * bucket_capacity
    stamped = strategy == ref.TIMESTAMP_DECAYED_LFU
    return [
        torch.zeros(num_buckets, bucket_capacity, dtype=torch.uint8),
        torch.zeros(slots, dtype=torch.int64),
        torch.zeros(slots, dtype=torch.int64),
        torch.zeros(slots if stamped else 0, dtype=torch.int64),
        torch.zeros(slots, ROW),
        torch.zeros(num_buckets, dtype=torch.int32),
        torch.zeros(num_buckets, dtype=torch.uint8),
        torch.zeros(0, ROW),
        torch.zeros(slots, dtype=torch.int32),
    ]


@pytest.fixture(params=[1, 2], ids=["cpu-1-thread", "cpu-2-threads"])
def cpu_threads(request):
    previous = _ops.set_thread_limit(request.param)
    yield request.param
    _ops.set_thread_limit(previous)


def _policy(strategy, b, step):
    """Batch b at table step ``step``; pins: this batch's."""
    return _ops.Policy(strategy, 10 + b, 7, _ops.EVICT_ANY, DIM, 1 + b, 1 + b, HALF_LIFE, step)


@pytest.mark.parametrize("strategy", [ref.DECAYED_LFU, ref.TIMESTAMP_DECAYED_LFU])
def test_find_or_insert_assign_and_claims_agree_on_every_executor(strategy, cpu_threads):
    table = parity_table(strategy, num_buckets=8)  # 128 slots
    g = torch.Generator().manual_seed(4)
    for b, keys in enumerate(key_batches(3, 3000, 1500, 3)):
        step = 1 + 40 * b  # steps apart: stored scores decay between batches
        table = run_on_every_executor(
            table,
            partial(
                find_or_insert_outputs, policy=_policy(strategy, b, step), keys=keys, scores=None
            ),
        )
        rows = torch.randn(keys.numel(), DIM, generator=g)
        policy = _policy(strategy, b, step + 1)
        table = run_on_every_executor(
            table, partial(assign_outputs, policy=policy, keys=keys, scores=None, rows=rows)
        )
        unique, _, counts = torch.ops.dynemb.unique_keys(keys)
        policy = _policy(strategy, b, step + 2)
        table = run_on_every_executor(
            table, partial(claim_outputs, policy=policy, keys=unique, counts=counts)
        )


def test_claims_score_repeated_keys_as_the_oracle():
    """A claim's accesses: c occurrences at step s score s + H log2 c, merged as the
    oracle merges; the same bits on the CPU and the emulated executor."""
    table = parity_table(ref.DECAYED_LFU, num_buckets=64)  # room for every key: no eviction
    want: dict[int, int] = {}
    for b, raw in enumerate(key_batches(5, 400, 300, 4)):
        keys, _, counts = torch.ops.dynemb.unique_keys(raw)
        step = 1 + 5 * b
        policy = _policy(ref.DECAYED_LFU, b, step)
        table = run_on_every_executor(
            table, partial(claim_outputs, policy=policy, keys=keys, counts=counts)
        )
        for k, c in zip(keys.tolist(), counts.tolist(), strict=True):
            want[k] = decay.touched(want.get(k), step, c, HALF_LIFE)
    slots = torch.ops.dynemb.table_find_slots(table, torch.tensor(sorted(want)))
    assert bool((slots >= 0).all())
    assert table[2][slots].tolist() == [want[k] for k in sorted(want)]
