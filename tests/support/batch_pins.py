"""Models and checks of the batch-pin tests: a small evicting module, the rows its
keys start with, and the check that each step read and trained only its own keys' rows."""

import torch

import dynemb
from dynemb import (
    DynamicEmbCheckMode,
    DynamicEmbInitializerArgs,
    DynamicEmbInitializerMode,
    DynamicEmbPoolingMode,
    DynamicEmbScoreStrategy,
    DynamicEmbTableOptions,
)
from dynemb.optimizer import EmbOptimType

S = DynamicEmbScoreStrategy


UNIFORM = DynamicEmbInitializerArgs(mode=DynamicEmbInitializerMode.UNIFORM, lower=-1.0, upper=1.0)


CONSTANT = DynamicEmbInitializerArgs(mode=DynamicEmbInitializerMode.CONSTANT, value=0.0)


def pin_options(strategy, capacity, bucket, dim=4, init=UNIFORM):
    return DynamicEmbTableOptions(
        dim=dim, max_capacity=capacity, bucket_capacity=bucket, score_strategy=strategy,
        initializer_args=init, safe_check_mode=DynamicEmbCheckMode.IGNORE, seed=3,
    )  # fmt: skip


def pin_module(strategy, capacity, bucket, dim=4, init=UNIFORM, pooling=DynamicEmbPoolingMode.NONE):
    options = pin_options(strategy, capacity, bucket, dim, init)
    return dynemb.BatchedDynamicEmbeddingTables(
        [options], [0], pooling_mode=pooling, optimizer=EmbOptimType.EXACT_SGD, learning_rate=1.0
    )


def initial_rows(keys, dim=4):
    """Each key's initial row: a function of (seed, key), read from a large table."""
    big = pin_module(S.NO_EVICTION, 1 << 14, 128, dim)
    with torch.no_grad():
        return big(keys, torch.arange(keys.numel() + 1))


def stored_rows(module):
    table = module.tables[0]
    keys, values, _, _ = table.export_batch(0, table.capacity())
    return {int(k): v.clone() for k, v in zip(keys, values, strict=True)}


def lookup_rows(module, keys):
    return module(keys, torch.arange(keys.numel() + 1))


def check_own_rows(module, keys, out, before, after, init):
    """Every lookup read its own stored row, its own initial row, or (not stored)
    zeros; every stored key of the batch moved by exactly its own lookups."""
    counts, first = {}, {}
    for i, k in enumerate(keys.tolist()):
        counts[k] = counts.get(k, 0) + 1
        first.setdefault(k, i)
    for i, k in enumerate(keys.tolist()):
        row = out[i].detach()
        if k in before:
            assert torch.equal(row, before[k]), f"key {k}: not its stored row"
        elif k in after:
            assert torch.equal(row, init[i]), f"key {k}: not its initial row"
        else:
            assert not row.any(), f"key {k} (not stored): not the eval initializer's row"
    for k, row in after.items():
        if k in counts:
            start = before.get(k, init[first[k]])
            assert torch.equal(row, start - counts[k]), f"key {k}: another key's gradient"
        elif k in before:
            assert torch.equal(row, before[k]), f"key {k}: changed without a lookup"
