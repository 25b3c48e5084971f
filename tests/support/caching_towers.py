"""A one-table module (in memory, or in caching mode) with two features, its batches
of 2 x BAGS bags of POOL keys, and a loss linear in every output."""

import torch

from dynemb import (
    BatchedDynamicEmbeddingTables,
    DynamicEmbInitializerArgs,
    DynamicEmbPoolingMode,
    DynamicEmbScoreStrategy,
    DynamicEmbTableOptions,
)
from dynemb.optimizer import OptimizerConfig

DIM, BAGS, POOL = 4, 4, 3


def module(optimizer, cache_rows=0, strategy=DynamicEmbScoreStrategy.LFU):
    """One table, two features; ``cache_rows`` > 0: caching mode."""
    o = dict(
        dim=DIM, max_capacity=4096, score_strategy=strategy,
        initializer_args=DynamicEmbInitializerArgs(lower=-0.5, upper=0.5), seed=5,
    )  # fmt: skip
    if cache_rows:
        width = DIM + OptimizerConfig(optimizer).state_columns(DIM)
        o.update(caching=True, local_hbm_for_values=cache_rows * width * 4)
    return BatchedDynamicEmbeddingTables(
        [DynamicEmbTableOptions(**o)], feature_table_map=[0, 0],
        pooling_mode=DynamicEmbPoolingMode.SUM, optimizer=optimizer, learning_rate=0.1,
    )  # fmt: skip


def batch(keys):
    """Two features x BAGS bags of POOL keys each (len(keys) == 2 * BAGS * POOL)."""
    keys = torch.as_tensor(keys, dtype=torch.int64)
    return keys, torch.arange(0, keys.numel() + 1, POOL, dtype=torch.int64)


def loss(outs):
    """Linear in every output: each forward gets its own weights."""
    w = torch.linspace(-1.0, 1.0, 2 * DIM)
    return sum(((k + 1) * w * o).sum() for k, o in enumerate(outs))
