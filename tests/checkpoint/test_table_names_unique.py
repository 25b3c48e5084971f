"""Table names are unique wherever tables are named: two tables of one name would be
dumped as one, and a load would then fill both with the second table's rows; they are
refused."""

import pytest
import torch

from dynemb import (
    BatchedDynamicEmbeddingTables,
    DynamicEmbDump,
    DynamicEmbLoad,
    DynamicEmbTableOptions,
)
from dynemb.batched_dynamicemb_tables import BatchedDynamicEmbeddingTablesV2
from dynemb.inference.exportable_tables import InferenceEmbeddingCollection

pytestmark = pytest.mark.no_emulated_pass("table naming in dumps and modules: Python only")

OPTIONS = [DynamicEmbTableOptions(dim=4, max_capacity=256)] * 3


def _module(names, count=None):
    count = len(names) if names is not None else count
    return BatchedDynamicEmbeddingTables(OPTIONS[:count], range(count), table_names=names)


# Each public constructor that takes table_names: (names, number of tables) -> module.
CONSTRUCTORS = {
    "BatchedDynamicEmbeddingTables": _module,
    "BatchedDynamicEmbeddingTablesV2": lambda names, count=None: BatchedDynamicEmbeddingTablesV2(
        OPTIONS[: count or len(names)], table_names=names
    ),
    "InferenceEmbeddingCollection": lambda names, count=None: InferenceEmbeddingCollection(
        OPTIONS[: count or len(names)], table_names=names
    ),
}


@pytest.mark.parametrize("constructor", CONSTRUCTORS)
@pytest.mark.parametrize(
    "names, duplicate",
    [
        (["a", "a"], "'a' is at positions \\[0, 1\\]"),
        (["a", "b", "b"], "'b' is at positions \\[1, 2\\]"),
    ],
)
def test_a_name_used_twice_is_refused_with_its_positions(constructor, names, duplicate):
    with pytest.raises(ValueError, match="table_names must name each table once: " + duplicate):
        CONSTRUCTORS[constructor](names)


@pytest.mark.parametrize("constructor", CONSTRUCTORS)
def test_default_and_distinct_names_are_accepted(constructor):
    assert CONSTRUCTORS[constructor](["a", "b"]).table_names == ["a", "b"]
    assert CONSTRUCTORS[constructor](None, 3).table_names == ["table_0", "table_1", "table_2"]


def _rows(table):
    keys, values, _, _ = table.export_batch(0, table.capacity())
    order = torch.argsort(keys)
    return keys[order], values[order]


def test_distinct_names_keep_each_tables_rows_through_dump_and_load(tmp_path):
    """The issue's case with its names made distinct: keys 1, 2 stay in the first table."""
    trained = _module(["a", "b"])
    # 2 features (one per table) x B=2 bags: f0 = [[1], [2]], f1 = [[3], [4]]
    trained(torch.tensor([1, 2, 3, 4]), torch.tensor([0, 1, 2, 3, 4])).sum().backward()
    DynamicEmbDump(tmp_path / "ckpt", trained)
    loaded = _module(["a", "b"])
    DynamicEmbLoad(tmp_path / "ckpt", loaded)
    for want_keys, before, after in zip(([1, 2], [3, 4]), trained.tables, loaded.tables):
        keys, values = _rows(after)
        assert keys.tolist() == want_keys
        assert torch.equal(values, _rows(before)[1])
