"""DYNAMICEMB_API.md section 10: DynamicEmbDump / DynamicEmbLoad arguments."""

import inspect

import pytest
import torch

from dynemb import (
    BatchedDynamicEmbeddingTables,
    DynamicEmbDump,
    DynamicEmbLoad,
    DynamicEmbTableOptions,
)

pytestmark = pytest.mark.no_emulated_pass("signatures: Python only")


def test_signatures():
    dump = inspect.signature(DynamicEmbDump).parameters
    assert list(dump)[:7] == [
        "path", "model", "table_names", "optim", "counter", "pg", "allow_overwrite"
    ]  # fmt: skip
    assert [dump[n].default for n in ("table_names", "optim", "counter", "allow_overwrite")] == [
        None, False, False, False
    ]  # fmt: skip
    load = inspect.signature(DynamicEmbLoad).parameters
    assert list(load)[:6] == ["path", "model", "table_names", "optim", "counter", "pg"]
    assert [load[n].default for n in ("table_names", "optim", "counter")] == [None, False, False]


def Model():  # reads as the model class of these tests
    # A bare module is the collection "model" (a sharded one: "model.<path>").
    return BatchedDynamicEmbeddingTables(
        [DynamicEmbTableOptions(dim=2, max_capacity=64, bucket_capacity=16)] * 2,
        feature_table_map=[0, 1],
        table_names=["a", "b"],
    )


def train(model):
    model(torch.tensor([1, 2, 3]), torch.tensor([0, 2, 3])).sum().backward()


def test_dump_into_a_non_empty_directory_needs_allow_overwrite(tmp_path):
    model = Model()
    train(model)
    DynamicEmbDump(tmp_path, model)
    with pytest.raises(FileExistsError, match="allow_overwrite=True"):
        DynamicEmbDump(tmp_path, model)
    DynamicEmbDump(tmp_path, model, allow_overwrite=True)
    loaded = Model()
    DynamicEmbLoad(tmp_path, loaded)
    assert loaded.tables[0].size() == 2 and loaded.tables[1].size() == 1


def test_table_names_by_collection_path(tmp_path):
    model = Model()
    train(model)
    DynamicEmbDump(tmp_path, model, table_names={"model": ["b"]})
    loaded = Model()
    DynamicEmbLoad(tmp_path, loaded, table_names={"model": ["b"]})
    assert [t.size() for t in loaded.tables] == [0, 1]
    with pytest.raises(ValueError, match="unknown collection 'model.y'"):
        DynamicEmbDump(tmp_path / "other", model, table_names={"model.y": ["a"]})
    with pytest.raises(ValueError, match=r"\['c'\] are not dynamic tables"):
        DynamicEmbDump(tmp_path / "other", model, table_names={"model": ["c"]})
