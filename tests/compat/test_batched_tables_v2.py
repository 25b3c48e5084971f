"""DYNAMICEMB_API.md section 7: BatchedDynamicEmbeddingTablesV2's signature and outputs."""

import inspect

import pytest
import torch
from fbgemm_gpu.split_table_batched_embeddings_ops_common import BoundsCheckMode
from fbgemm_gpu.split_table_batched_embeddings_ops_training import WeightDecayMode

from dynemb import (
    DynamicEmbInitializerArgs,
    DynamicEmbInitializerMode,
    DynamicEmbPoolingMode,
    DynamicEmbTableOptions,
    EmbOptimType,
)
from dynemb.batched_dynamicemb_tables import BatchedDynamicEmbeddingTablesV2

DEBUG = DynamicEmbInitializerArgs(mode=DynamicEmbInitializerMode.DEBUG)


def options(dim=4):
    return DynamicEmbTableOptions(
        dim=dim, max_capacity=256, bucket_capacity=16, initializer_args=DEBUG
    )


def test_signature_and_defaults():
    params = inspect.signature(BatchedDynamicEmbeddingTablesV2).parameters
    want = {
        "table_options": inspect.Parameter.empty,
        "table_names": None,
        "feature_table_map": None,
        "use_index_dedup": False,
        "prefetch_pipeline": False,
        "pooling_mode": DynamicEmbPoolingMode.SUM,
        "output_dtype": torch.float32,
        "device": None,
        "enforce_hbm": False,
        "bounds_check_mode": BoundsCheckMode.WARNING,
        "optimizer": EmbOptimType.SGD,
        "stochastic_rounding": True,
        "gradient_clipping": False,
        "max_gradient": 1.0,
        "max_norm": 0.0,
        "learning_rate": 0.01,
        "eps": 1e-8,
        "initial_accumulator_value": 0.0,
        "momentum": 0.9,
        "weight_decay": 0.0,
        "weight_decay_mode": WeightDecayMode.NONE,
        "eta": 0.001,
        "beta1": 0.9,
        "beta2": 0.999,
        "counter_based_regularization": None,
        "cowclip_regularization": None,
    }
    named = [n for n, p in params.items() if p.kind == p.POSITIONAL_OR_KEYWORD]
    assert named == list(want)
    assert {n: params[n].default for n in named} == want
    assert [p.kind for p in params.values()][-2:] == [
        inspect.Parameter.VAR_POSITIONAL,
        inspect.Parameter.VAR_KEYWORD,
    ]


def test_one_feature_per_table_by_default_and_pooled_output():
    tables = BatchedDynamicEmbeddingTablesV2(
        [options(4), options(2)], table_names=["a", "b"], use_index_dedup=True
    )
    assert tables.feature_table_map == [0, 1]
    # B = 2: a = [[1, 2], [3]], b = [[], [100_005]]
    out = tables(torch.tensor([1, 2, 3, 100_005]), torch.tensor([0, 2, 3, 3, 4]))
    assert out.shape == (2, 6)
    assert out.tolist() == [[3.0] * 4 + [0.0] * 2, [3.0] * 4 + [5.0] * 2]


def test_sequence_output_shape():
    tables = BatchedDynamicEmbeddingTablesV2(
        [options(4)], table_names=["a"], pooling_mode=DynamicEmbPoolingMode.NONE
    )
    out = tables(torch.tensor([7, 8, 9]), torch.tensor([0, 2, 3]))
    assert out.shape == (3, 4) and out[:, 0].tolist() == [7.0, 8.0, 9.0]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_output_dtype(dtype):
    tables = BatchedDynamicEmbeddingTablesV2([options()], table_names=["a"], output_dtype=dtype)
    out = tables(torch.tensor([7, 8]), torch.tensor([0, 2]))
    assert out.dtype == dtype and out.float().tolist() == [[15.0] * 4]


def test_training_updates_rows_with_the_optimizer():
    tables = BatchedDynamicEmbeddingTablesV2(
        [options()], table_names=["a"], optimizer=EmbOptimType.SGD, learning_rate=0.5
    )
    tables(torch.tensor([7]), torch.tensor([0, 1])).sum().backward()
    values, found = tables.tables[0].find(torch.tensor([7]))
    assert found.tolist() == [True] and values.tolist() == [[6.5] * 4]


def test_bad_output_dtype_raises():
    with pytest.raises(ValueError, match="output_dtype.*torch.int32"):
        BatchedDynamicEmbeddingTablesV2([options()], table_names=["a"], output_dtype=torch.int32)
