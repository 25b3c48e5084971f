"""dynemb.table_groups: the one walk that finds a model's groups of dynamic tables, by the
``dynamic_table_groups`` protocol (not by class), and the callers that use it on an
unsharded model: checkpoints' table names, incremental dumps' collections, telemetry and
``get_dynamic_emb_module``. Sharded models: tests/compat/test_dump_load_helpers.py,
tests/checkpoint, tests/test_telemetry.py's workers."""

import pytest
import torch.nn as nn

from dynemb import BatchedDynamicEmbeddingTables, DynamicEmbTableOptions, table_telemetry
from dynemb.checkpoint.tables import CollectionGroups, named_tables
from dynemb.dump_load import get_dynamic_emb_module
from dynemb.incremental_dump import get_score
from dynemb.table_groups import collection_path, public_collection_path, table_groups

pytestmark = pytest.mark.no_emulated_pass("walks modules; runs no table op")


def _group(*names):
    options = [DynamicEmbTableOptions(dim=4, max_capacity=64, bucket_capacity=16) for _ in names]
    return BatchedDynamicEmbeddingTables(options, list(range(len(names))), table_names=list(names))


class _Model(nn.Module):
    def __init__(self, first, second):
        super().__init__()
        self.sparse = nn.ModuleDict({"a": first})
        self.other = nn.Sequential(nn.Linear(2, 2), second)


class _Holder(nn.Module):
    """Holds a group outside ``modules()`` (as TorchRec's sharded collections hold their
    lookups) and shows it through the protocol only."""

    def __init__(self, group):
        super().__init__()
        self._hidden = [group]

    def dynamic_table_groups(self):
        return [("inner", self._hidden[0])]


def test_walk_finds_groups_in_module_order_once():
    first, second = _group("t0", "t1"), _group("u0")
    model = _Model(first, second)
    model.alias = first  # the same group at a second path: reported once, at the first
    assert [(p, g) for p, g in table_groups(model)] == [("sparse.a", first), ("other.1", second)]
    assert table_groups(first) == [("", first)]
    assert table_groups(nn.Linear(2, 2)) == []


def test_walk_asks_the_protocol_not_the_class():
    group = _group("t0")
    holder = _Holder(group)
    assert table_groups(nn.Sequential(holder)) == [("0.inner", group)]
    groups = CollectionGroups({"sparse.ebc": group})
    assert table_groups(groups) == [("sparse.ebc", group)]


def test_walk_refuses_what_is_no_module():
    with pytest.raises(TypeError, match="model must be a torch.nn.Module, got dict"):
        table_groups({})


def test_collection_paths_drop_wrapper_levels():
    assert collection_path("module._dmp_wrapped_module.sparse.ebc") == "sparse.ebc"
    assert collection_path("") == ""
    assert public_collection_path("module") == "model"
    assert public_collection_path("module.sparse.ebc") == "model.sparse.ebc"


def test_every_caller_finds_the_same_groups():
    first, second = _group("t0", "t1"), _group("u0")
    model = _Model(first, second)
    assert [t.name for t in named_tables(model)] == ["other.1.u0", "sparse.a.t0", "sparse.a.t1"]
    assert get_dynamic_emb_module(model) == [first, second]
    assert sorted(table_telemetry(model)) == ["t0", "t1", "u0"]
    assert {c: sorted(s) for c, s in get_score(model).items()} == {
        "model.sparse.a": ["t0", "t1"],
        "model.other.1": ["u0"],
    }
    holder = nn.Sequential(_Holder(second))
    assert [t.name for t in named_tables(holder)] == ["0.inner.u0"]
    assert get_dynamic_emb_module(holder) == [second]
