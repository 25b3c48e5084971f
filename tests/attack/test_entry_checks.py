"""Values that enter from user code are checked where they enter: a custom admission
strategy must return a bool tensor (an int or float one is refused: 0.7 would count as
admitted), and ``set_score`` takes int64 scores only (``2**63`` is refused when it is
set, not by an int64 overflow in the next training step)."""

import pytest
import torch

from dynemb import (
    AdmissionStrategy,
    BatchedDynamicEmbeddingTables,
    DynamicEmbScoreStrategy,
    DynamicEmbTableOptions,
    KVCounter,
)
from dynemb.incremental_dump import get_score, set_score

KEYS = torch.tensor([1, 2, 3])
OFFSETS = torch.arange(4)  # one feature, three bags of one key


class _Returns(AdmissionStrategy):
    def __init__(self, value):
        self.value = value

    def admit(self, keys, frequencies):
        return self.value

    def get_initializer_args(self):
        return None


def _admitting(value):
    options = DynamicEmbTableOptions(
        dim=4,
        max_capacity=128,
        admit_strategy=_Returns(value),
        admission_counter=KVCounter(capacity=64, bucket_capacity=16),
    )
    return BatchedDynamicEmbeddingTables([options], [0], table_names=["t"])


@pytest.mark.parametrize(
    "value, got",
    [
        (torch.tensor([0.7, 0.0, 1.0]), r"a \(3,\) torch.float32 tensor"),
        (torch.tensor([1, 0, 1]), r"a \(3,\) torch.int64 tensor"),
        (torch.tensor([True, False]), r"a \(2,\) torch.bool tensor"),
        ([True, False, True], r"\[True, False, True\]"),
    ],
)
def test_an_admit_that_returns_no_bool_tensor_is_refused_by_name(value, got):
    module = _admitting(value)
    match = r"table 't': admit_strategy.admit must return a \(3,\) torch.bool tensor, got " + got
    with pytest.raises(TypeError, match=match):
        module(KEYS, OFFSETS)
    assert module.tables[0].size() == 0


def test_a_bool_admit_stores_the_keys_it_admits():
    module = _admitting(torch.tensor([True, False, True]))
    module(KEYS, OFFSETS)
    assert module.tables[0].contains(KEYS).tolist() == [True, False, True]


def _customized():
    options = DynamicEmbTableOptions(
        dim=4, max_capacity=128, score_strategy=DynamicEmbScoreStrategy.CUSTOMIZED
    )
    return BatchedDynamicEmbeddingTables([options], [0], table_names=["t"])


@pytest.mark.parametrize("score", [2**63, 2**64 + 5, -1])
@pytest.mark.parametrize("form", ["int", "dict"])
def test_set_score_refuses_a_score_outside_int64(score, form):
    module = _customized()
    set_score(module, 5)
    arg = score if form == "int" else {"model": {"t": score}}
    with pytest.raises(ValueError, match=rf"must be >= 0 and <= {2**63 - 1}.*got {score}"):
        set_score(module, arg)
    assert get_score(module) == {"model": {"t": 5}}  # unchanged


def test_the_largest_score_trains():
    module = _customized()
    set_score(module, 2**63 - 1)
    module(KEYS, OFFSETS).sum().backward()
    assert module.tables[0].get_scores(KEYS).tolist() == [2**63 - 1] * 3


def test_a_table_refuses_a_custom_score_outside_int64():
    table = _customized().tables[0]
    with pytest.raises(ValueError, match=r"custom_score must be <= 9223372036854775807"):
        table.custom_score = 2**63
