"""Training steps whose reads of device values tests/tbe/test_host_reads.py counts: one
module per scenario, a warm-up step, then steps counted one by one with
``dynemb._host_reads.host_reads`` (the Python layer's reads and the emulated executor's
ops' own). ``python -m tests.support.host_read_steps`` prints ``{scenario: [reads per
step]}`` as JSON for the executor that DYNEMB_EXECUTOR selects."""

import json

import torch

import dynemb
from dynemb import (
    DynamicEmbCheckMode,
    DynamicEmbInitializerArgs,
    DynamicEmbInitializerMode,
    DynamicEmbPoolingMode,
    DynamicEmbScoreStrategy,
    DynamicEmbTableOptions,
    FrequencyAdmissionStrategy,
    KVCounter,
)
from dynemb._host_reads import host_reads
from dynemb.optimizer import EmbOptimType

DIM = 8
STEPS = 3
UNIFORM = DynamicEmbInitializerArgs(mode=DynamicEmbInitializerMode.UNIFORM, lower=-1.0, upper=1.0)


def _options(capacity: int, **extra) -> DynamicEmbTableOptions:
    return DynamicEmbTableOptions(
        dim=DIM, max_capacity=capacity, bucket_capacity=128,
        score_strategy=DynamicEmbScoreStrategy.LFU, initializer_args=UNIFORM,
        safe_check_mode=DynamicEmbCheckMode.IGNORE, seed=3, **extra,
    )  # fmt: skip


def _cached() -> DynamicEmbTableOptions:
    """A cache of 256 rows in front of the table."""
    return _options(4096, caching=True, local_hbm_for_values=256 * DIM * 4)


# scenario -> (table options, feature_table_map); keys are drawn from [0, 3000).
SCENARIOS = {
    "one_table": lambda: ([_options(4096)], [0, 0]),
    # W-train-like: eight tables, one feature each, in one grouped lookup
    "eight_tables": lambda: ([_options(4096) for _ in range(8)], list(range(8))),
    # 256 rows for ~1,000 distinct keys a step: every step evicts, in-batch too
    "evicting": lambda: ([_options(256)], [0]),
    # a cache of 256 rows in front of the table
    "caching": lambda: ([_cached()], [0]),
    # a cached table beside an in-memory one: the cache's read takes the other's count
    "cached_and_plain": lambda: ([_cached(), _options(4096)], [0, 1]),
    "admission": lambda: (
        [
            _options(
                4096,
                admit_strategy=FrequencyAdmissionStrategy(
                    2, counter=KVCounter(capacity=4096, bucket_capacity=128)
                ),
            )  # fmt: skip
        ],
        [0],
    ),
}


def _batches(num_features: int, steps: int, batch_size: int = 128, bag: int = 4):
    gen = torch.Generator().manual_seed(0)
    for _ in range(steps):
        lengths = torch.randint(0, bag + 1, (num_features * batch_size,), generator=gen)
        offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])
        yield torch.randint(0, 3000, (int(offsets[-1]),), generator=gen), offsets


def reads_per_step(scenario: str) -> list[int]:
    """The reads of each of ``STEPS`` training steps (forward, ``sum().backward()``)
    after a warm-up step."""
    options, feature_table_map = SCENARIOS[scenario]()
    module = dynemb.BatchedDynamicEmbeddingTables(
        options, feature_table_map, pooling_mode=DynamicEmbPoolingMode.SUM,
        optimizer=EmbOptimType.EXACT_ROWWISE_ADAGRAD, learning_rate=0.1,
    )  # fmt: skip
    counts = []
    for step, (indices, offsets) in enumerate(_batches(len(feature_table_map), STEPS + 1)):
        before = host_reads()
        module(indices, offsets).sum().backward()
        if step:
            counts.append(host_reads() - before)
    return counts


if __name__ == "__main__":
    print(json.dumps({name: reads_per_step(name) for name in SCENARIOS}))
