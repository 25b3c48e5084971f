"""A safe-check report says why keys could not be stored and what avoids it.

An evicting table fails a key only when the key's bucket holds keys of batches in
flight alone (the batch rule: they are never evicted), however empty the rest of the
table is; a NO_EVICTION table fails keys once it cannot grow past max_capacity. The
two read differently, each with what to change.
"""

import pytest
import torch

from dynemb import (
    BatchedDynamicEmbeddingTables,
    DynamicEmbCheckMode,
    DynamicEmbScoreStrategy,
    DynamicEmbTableOptions,
    _ops,
)
from dynemb.optimizer import EmbOptimType

BUCKET, BUCKETS = 16, 4


def _module(strategy, capacity):
    options = DynamicEmbTableOptions(
        dim=4, max_capacity=capacity, bucket_capacity=BUCKET, score_strategy=strategy,
        safe_check_mode=DynamicEmbCheckMode.ERROR,
    )  # fmt: skip
    return BatchedDynamicEmbeddingTables([options], [0], optimizer=EmbOptimType.EXACT_SGD)


def _keys_of_one_bucket(n):
    """n keys that hash to bucket 0 of BUCKETS."""
    keys = torch.arange(100_000)
    bucket, _ = _ops.hash_keys(keys, BUCKETS)
    return keys[bucket == 0][:n]


def test_an_evicting_table_says_the_bucket_held_only_keys_in_flight():
    m = _module(DynamicEmbScoreStrategy.LFU, BUCKET * BUCKETS)
    keys = _keys_of_one_bucket(BUCKET + 3)  # one bucket, 3 keys too many for one batch
    with pytest.raises(RuntimeError) as error:
        m(keys, torch.arange(keys.numel() + 1))
    message = str(error.value)
    assert "'table_0': 3 keys could not be stored" in message
    assert "bucket held only keys of batches in flight" in message
    assert f"holds {BUCKET} of {BUCKET * BUCKETS} keys in buckets of {BUCKET}" in message
    assert "a larger bucket_capacity, smaller batches or a larger max_capacity" in message
    assert "full" not in message


def test_a_table_without_eviction_says_it_cannot_grow():
    m = _module(DynamicEmbScoreStrategy.NO_EVICTION, 32)
    keys = torch.arange(1000, 1040)
    with pytest.raises(RuntimeError) as error:
        m(keys, torch.arange(keys.numel() + 1))
    message = str(error.value)
    assert "NO_EVICTION: the table grows no further than max_capacity 32" in message
    assert "raise max_capacity" in message
