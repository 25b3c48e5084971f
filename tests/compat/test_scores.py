"""DYNAMICEMB_API.md section 8: get_score / set_score / incremental_dump structures."""

import pytest
import torch
from torch import nn

from dynemb import BatchedDynamicEmbeddingTables, DynamicEmbScoreStrategy, DynamicEmbTableOptions
from dynemb.incremental_dump import get_score, incremental_dump, set_score

S = DynamicEmbScoreStrategy


def tables(strategy=S.STEP, names=("t0", "t1")):
    return BatchedDynamicEmbeddingTables(
        [
            DynamicEmbTableOptions(
                dim=4, max_capacity=256, bucket_capacity=16, score_strategy=strategy
            )
            for _ in names
        ],
        feature_table_map=list(range(len(names))),
        table_names=list(names),
    )


def lookup(module, keys0, keys1):
    keys = torch.tensor(keys0 + keys1)
    offsets = torch.tensor([0, len(keys0), len(keys0) + len(keys1)])
    module(keys, offsets).sum().backward()


class Model(nn.Module):
    def __init__(self, strategy=S.STEP):
        super().__init__()
        self.x = tables(strategy)


def test_root_collection_is_model_and_children_are_model_dot_path():
    assert set(get_score(tables())) == {"model"}
    assert set(get_score(Model())) == {"model.x"}
    assert get_score(Model())["model.x"] == {"t0": 1, "t1": 1}  # STEP: the next step


def test_get_score_without_dynamic_tables_is_none():
    with pytest.warns(UserWarning, match="no dynamic embedding table"):
        assert get_score(nn.Linear(2, 2)) is None
    with pytest.warns(UserWarning, match="no dynamic embedding table"):
        assert incremental_dump(nn.Linear(2, 2), 0) is None


def test_incremental_dump_returns_keys_and_values_then_scores():
    model = Model()
    before = get_score(model)
    lookup(model.x, [5, 6], [7])
    dumped, now = incremental_dump(model, before)
    keys, values = dumped["model.x"]["t0"]
    assert sorted(keys.tolist()) == [5, 6] and values.shape == (2, 4)
    assert values.dtype == torch.float32 and keys.dtype == torch.int64
    assert now == {"model.x": {"t0": 2, "t1": 2}}
    full, _ = incremental_dump(model, 0, with_scores=True)
    assert len(full["model.x"]["t1"]) == 3 and full["model.x"]["t1"][2].tolist() == [1]


def test_set_score_takes_one_int_for_every_table():
    module = tables(S.CUSTOMIZED)
    set_score(module, 5)
    assert get_score(module) == {"model": {"t0": 5, "t1": 5}}
    lookup(module, [1], [2])
    assert module.tables[0].get_scores(torch.tensor([1])).tolist() == [5]


def test_set_score_takes_collection_names():
    model = Model(S.CUSTOMIZED)
    set_score(model, {"x": {"t1": 9}})  # DynamicEmb's key: the attribute name
    set_score(model, {"model.x": {"t0": 4}})  # or the path
    assert get_score(model) == {"model.x": {"t0": 4, "t1": 9}}


def test_set_score_int_on_a_table_that_is_not_customized_raises():
    with pytest.raises(ValueError, match="only CUSTOMIZED"):
        set_score(tables(S.STEP), 3)
