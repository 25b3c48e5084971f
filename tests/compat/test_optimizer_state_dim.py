"""``dynemb.optimizer.get_optimizer_state_dim(optimizer_type, dim, dtype=None)``
(DynamicEmb's function): the optimizer-state elements a row keeps beside its embedding,
checked against an independent table of the optimizers' states, against the width of
the rows a table allocates and against ``get_table_value_bytes``; DynamicEmb's errors."""

import pytest
import torch
from torchrec.modules.embedding_configs import EmbeddingConfig

from dynemb import BatchedDynamicEmbeddingTables, DynamicEmbTableOptions, get_table_value_bytes
from dynemb.optimizer import DynamicEmbOptimType, EmbOptimType, get_optimizer_state_dim

pytestmark = pytest.mark.no_emulated_pass("a rule read from the core: Python only")

# Adam keeps m and v per element, Adagrad one accumulator per element, row-wise Adagrad
# one accumulator per row (DynamicEmb reserves 16 bytes for it; dynemb keeps the one).
STATE = {
    EmbOptimType.SGD: lambda d: 0,
    EmbOptimType.EXACT_SGD: lambda d: 0,
    EmbOptimType.ADAM: lambda d: 2 * d,
    EmbOptimType.EXACT_ADAGRAD: lambda d: d,
    EmbOptimType.EXACT_ROWWISE_ADAGRAD: lambda d: 1,
    DynamicEmbOptimType.FTRL: lambda d: 2 * d,  # linear then accumulator, per element
}


@pytest.mark.parametrize("optimizer", list(STATE))
@pytest.mark.parametrize("dim", [1, 16, 100])
def test_state_elements_per_row(optimizer, dim):
    assert get_optimizer_state_dim(optimizer, dim, torch.float32) == STATE[optimizer](dim)
    table = BatchedDynamicEmbeddingTables(
        [DynamicEmbTableOptions(dim=dim, max_capacity=128)], [0], optimizer=optimizer
    )
    assert table.tables[0].extra_columns == get_optimizer_state_dim(optimizer, dim, torch.float32)


@pytest.mark.parametrize("optimizer", list(STATE))
def test_row_bytes_agree_with_get_table_value_bytes(optimizer):
    config = EmbeddingConfig(name="t", embedding_dim=8, num_embeddings=1000, feature_names=["f"])
    rows = 1024  # 1000 rows on one rank, in buckets of 128
    width = 8 + get_optimizer_state_dim(optimizer, 8, torch.float32)
    assert get_table_value_bytes(config, optimizer, 1, 128) == rows * width * 4


def test_dtype_is_optional_except_for_rowwise_adagrad():
    assert get_optimizer_state_dim(EmbOptimType.ADAM, 4) == 8
    with pytest.raises(ValueError, match="`dtype` is required with EXACT_ROWWISE_ADAGRAD"):
        get_optimizer_state_dim(EmbOptimType.EXACT_ROWWISE_ADAGRAD, 4)


def test_an_optimizer_dynemb_does_not_run_keeps_no_state():
    assert get_optimizer_state_dim(EmbOptimType.LAMB, 4, torch.float32) == 0


@pytest.mark.parametrize(
    "args, error, text",
    [
        (
            ("adam", 4),
            TypeError,
            "`optimizer_type` must be an EmbOptimType or a DynamicEmbOptimType, got 'adam'",
        ),
        ((EmbOptimType.ADAM, 0), ValueError, "`dim` must be an int >= 1, got 0"),
    ],
)
def test_bad_arguments_are_named(args, error, text):
    with pytest.raises(error, match=text):
        get_optimizer_state_dim(*args)
