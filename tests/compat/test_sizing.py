"""DYNAMICEMB_API.md section 5: sizing helpers, optimizer state sizes, OptimizerArgs,
converters."""

import dataclasses

import pytest
import torch
from torchrec.modules.embedding_configs import DataType, EmbeddingConfig

import dynemb
from dynemb import EmbOptimType
from dynemb.types import DynamicEmbDataType, EvictStrategy

pytestmark = pytest.mark.no_emulated_pass("sizing arithmetic: Python only")


def config(rows=100, dim=8):
    return EmbeddingConfig(name="t", embedding_dim=dim, num_embeddings=rows, feature_names=["f"])


@pytest.mark.parametrize("n, want", [(-5, 16), (0, 16), (1, 16), (16, 16), (17, 32), (100, 112)])
def test_align_to_table_size(n, want):
    assert dynemb.align_to_table_size(n) == want


def test_align_to_table_size_alignment():
    assert dynemb.align_to_table_size(100, 64) == 128
    assert dynemb.align_to_table_size(0, 64) == 64


def test_sharded_table_capacity_examples():
    assert dynemb.get_sharded_table_capacity(config(100), 2, 128) == 128
    assert dynemb.get_sharded_table_capacity(config(100), 2, dynemb.MAX_BUCKET_CAPACITY) == 64


def test_sharded_table_capacity_has_no_upper_bucket_limit():
    assert dynemb.get_sharded_table_capacity(config(10_000), 2, 4096) == 8192


@pytest.mark.parametrize("bucket", [0, 8, 24, -16])
def test_sharded_table_capacity_rejects_bad_buckets(bucket):
    with pytest.raises(ValueError, match=f"bucket_capacity.*got {bucket}"):
        dynemb.get_sharded_table_capacity(config(), 2, bucket)


@pytest.mark.parametrize("world", [0, -2])
def test_sharded_table_capacity_rejects_bad_world_size(world):
    with pytest.raises(ValueError, match="world_size"):
        dynemb.get_sharded_table_capacity(config(), world, 128)


@pytest.mark.parametrize(
    "optimizer, state",
    [(EmbOptimType.SGD, 0), (EmbOptimType.EXACT_ADAGRAD, 8), (EmbOptimType.ADAM, 16)],
)
def test_table_value_bytes_count_all_ranks(optimizer, state):
    # 100 rows over 2 ranks -> 128 rows each (bucket 128); float32.
    got = dynemb.get_table_value_bytes(config(100, 8), optimizer, 2)
    assert got == 4 * (8 + state) * 128 * 2


def test_table_value_bytes_row_wise_adagrad_counts_dynembs_one_column():
    got = dynemb.get_table_value_bytes(config(100, 8), EmbOptimType.EXACT_ROWWISE_ADAGRAD, 2, 128)
    assert got == 4 * (8 + 1) * 128 * 2  # DynamicEmb reserves 16 bytes: see Differences


def test_optimizer_args_defaults():
    want = dict(
        stochastic_rounding=True, gradient_clipping=False, max_gradient=1.0, max_norm=0.0,
        learning_rate=0.01, eps=1e-8, initial_accumulator_value=0.0, beta1=0.9, beta2=0.999,
        weight_decay=0.0, weight_decay_mode=0, eta=0.001, momentum=0.9, counter_halflife=-1,
        adjustment_iter=-1, adjustment_ub=1.0, learning_rate_mode=-1, grad_sum_decay=-1,
        tail_id_threshold=0, is_tail_id_thresh_ratio=0, total_hash_size=0,
        weight_norm_coefficient=0, lower_bound=0, regularization_mode=0,
    )  # fmt: skip
    assert dataclasses.asdict(dynemb.OptimizerArgs()) == want
    assert [f.name for f in dataclasses.fields(dynemb.OptimizerArgs)] == list(want)


@pytest.mark.parametrize(
    "dtype, data_type",
    [
        (torch.float32, DynamicEmbDataType.Float32),
        (torch.float16, DynamicEmbDataType.Float16),
        (torch.bfloat16, DynamicEmbDataType.BFloat16),
        (torch.int64, DynamicEmbDataType.Int64),
        (torch.uint64, DynamicEmbDataType.UInt64),
    ],
)
def test_torch_dtype_converters_round_trip(dtype, data_type):
    assert dynemb.torch_to_dyn_emb(dtype) is data_type
    assert dynemb.dyn_emb_to_torch(data_type) is dtype


def test_torchrec_data_type_converters():
    assert dynemb.data_type_to_dtype(DataType.FP16) is torch.float16
    assert dynemb.data_type_to_dyn_emb(DataType.BF16) is DynamicEmbDataType.BFloat16
    assert dynemb.string_to_evict_strategy("lfu") is EvictStrategy.KLfu
    assert dynemb.string_to_evict_strategy("epoch_lru") is EvictStrategy.KEpochLru


@pytest.mark.parametrize(
    "convert, bad",
    [
        (dynemb.torch_to_dyn_emb, torch.complex64),
        (dynemb.dyn_emb_to_torch, "float32"),
        (dynemb.data_type_to_dtype, DataType.INT8),
        (dynemb.data_type_to_dyn_emb, DataType.INT4),
        (dynemb.string_to_evict_strategy, "fifo"),
    ],
)
def test_converters_reject_unknown_input(convert, bad):
    with pytest.raises(ValueError, match="unsupported|unknown"):
        convert(bad)
