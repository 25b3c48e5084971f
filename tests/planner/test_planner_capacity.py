"""Planner helpers: per-rank capacity aligned to buckets, and value bytes (all ranks)."""

import pytest
import torch
from torchrec.modules.embedding_configs import DataType, EmbeddingBagConfig, EmbeddingConfig

from dynemb.optimizer import EmbOptimType
from dynemb.planner import (
    BUCKET_ALIGNMENT,
    MAX_BUCKET_CAPACITY,
    get_sharded_table_capacity,
    get_table_value_bytes,
)
from dynemb.planner.capacity import effective_bucket_capacity

pytestmark = pytest.mark.no_emulated_pass("planning: no table op runs")


def config(num_embeddings=1000, dim=8, data_type=DataType.FP32, cls=EmbeddingBagConfig):
    return cls(
        name="t",
        embedding_dim=dim,
        num_embeddings=num_embeddings,
        feature_names=["f"],
        data_type=data_type,
    )


def test_constants():
    assert BUCKET_ALIGNMENT == 16
    assert MAX_BUCKET_CAPACITY == 2**63 - 1  # a sentinel: one bucket per rank


@pytest.mark.parametrize(
    "num_embeddings, world_size, bucket_capacity, expected",
    [
        (1000, 1, 128, 1024),  # 1000 -> 8 buckets
        (1000, 2, 128, 512),  # 500 -> 4 buckets
        (1000, 3, 128, 384),  # ceil(1000 / 3) = 334 -> 3 buckets
        (1024, 4, 256, 256),  # exact
        (1, 8, 16, 16),  # fewer rows than ranks: one bucket each
        (10**9, 7, 1024, 142857216),  # ceil(1e9 / 7) = 142857143 -> 139509 buckets of 1024
        (1000, 3, 2048, 2048),  # no upper limit on the bucket width
        (1000, 3, MAX_BUCKET_CAPACITY, 336),  # one bucket per rank: 334 rows -> 336
    ],
)
def test_sharded_table_capacity(num_embeddings, world_size, bucket_capacity, expected):
    got = get_sharded_table_capacity(config(num_embeddings), world_size, bucket_capacity)
    assert got == expected


def test_sharded_table_capacity_accepts_embedding_config():
    assert get_sharded_table_capacity(config(100, cls=EmbeddingConfig), 2, 16) == 64


@pytest.mark.parametrize(
    "num_embeddings, world_size, bucket_capacity, expected",
    [
        (1000, 2, 128, 128),
        (100, 2, 128, 128),  # as DynamicEmb: one whole bucket, however few the rows
        (40, 3, 128, 128),
        (40, 1, 32, 32),
        (100, 2, MAX_BUCKET_CAPACITY, 64),  # one bucket: 50 rows rounded up to 16
        (40, 3, MAX_BUCKET_CAPACITY, 16),
    ],
)
def test_effective_bucket_capacity(num_embeddings, world_size, bucket_capacity, expected):
    assert effective_bucket_capacity(num_embeddings, world_size, bucket_capacity) == expected


@pytest.mark.parametrize(
    "optimizer, columns",
    [
        (EmbOptimType.SGD, 8),
        (EmbOptimType.EXACT_SGD, 8),
        (EmbOptimType.EXACT_ROWWISE_ADAGRAD, 9),
        (EmbOptimType.EXACT_ADAGRAD, 16),
        (EmbOptimType.ADAM, 24),
    ],
)
def test_value_bytes_count_optimizer_state(optimizer, columns):
    # 1000 rows on 2 ranks -> 512 rows of float32 per rank, both ranks counted.
    assert get_table_value_bytes(config(), optimizer, 2, 128) == 2 * 512 * columns * 4


@pytest.mark.parametrize(
    "data_type, element_size", [(DataType.FP32, 4), (DataType.FP16, 2), (DataType.BF16, 2)]
)
def test_value_bytes_use_the_config_data_type(data_type, element_size):
    got = get_table_value_bytes(config(data_type=data_type), EmbOptimType.EXACT_SGD, 3, 128)
    assert got == 3 * 384 * 8 * element_size


def test_value_bytes_embedding_dtype_overrides_the_config():
    got = get_table_value_bytes(
        config(data_type=DataType.FP32), EmbOptimType.ADAM, 2, 128, torch.bfloat16
    )
    assert got == 2 * 512 * 24 * 2


def test_value_bytes_reject_unsupported_optimizer():
    with pytest.raises(ValueError, match="optimizer must be one of"):
        get_table_value_bytes(config(), EmbOptimType.LAMB, 2, 128)


@pytest.mark.parametrize("bucket_capacity", [0, 8, 24, 1041, 2**63 - 2, -16])
def test_bad_bucket_capacity_raises(bucket_capacity):
    with pytest.raises(ValueError, match=f"bucket_capacity.*got {bucket_capacity}"):
        get_sharded_table_capacity(config(), 2, bucket_capacity)


@pytest.mark.parametrize("world_size", [0, -1, 1.5])
def test_bad_world_size_raises(world_size):
    with pytest.raises(ValueError, match="world_size must be a positive int"):
        get_sharded_table_capacity(config(), world_size, 128)
