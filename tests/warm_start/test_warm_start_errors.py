"""Bad warm-start input raises a ValueError naming it, before any table exists or changes."""

import pytest
import torch

from dynemb import ScoredHashTable
from dynemb.optimizer import EmbOptimType
from dynemb.warm_start import TableFill, WarmStart
from tests.support.static_models import dynamic_twin, static_model


def _module(source, **kwargs):
    return dynamic_twin({"t0": source}, **kwargs)


def test_wrong_dim_is_refused_by_the_module():
    with pytest.raises(ValueError, match=r"table 't0': warm_start rows have dim 5, .* dim is 8"):
        _module(WarmStart.from_tensor(torch.randn(10, 5)))


def test_wrong_dtype_shape_or_ids_are_refused():
    with pytest.raises(
        ValueError, match=r"`weight` must be a 2-D floating tensor, got a \(10, 8\) torch.int64"
    ):
        WarmStart.from_tensor(torch.zeros(10, 8, dtype=torch.int64))
    with pytest.raises(ValueError, match=r"`weight` must be a 2-D floating tensor, got a \(10,\)"):
        WarmStart.from_tensor(torch.zeros(10))
    with pytest.raises(ValueError, match=r"`ids` must be a \(10,\) int64 tensor"):
        WarmStart.from_tensor(torch.zeros(10, 8), ids=torch.arange(9))
    with pytest.raises(ValueError, match=r"ids of the rows must be distinct"):
        WarmStart.from_tensor(torch.zeros(3, 8), ids=torch.tensor([1, 2, 1]))
    with pytest.raises(ValueError, match=r"`ids` must be None, one of .* got 'hash'"):
        WarmStart.from_tensor(torch.zeros(3, 8), ids="hash")
    with pytest.raises(ValueError, match=r"`state` must have 3 rows"):
        WarmStart.from_tensor(torch.zeros(3, 8), state=torch.zeros(4, 1))
    with pytest.raises(ValueError, match=r"warm_start must be a dynemb.warm_start.WarmStart"):
        _module(torch.zeros(3, 8))


def test_unknown_table_names_are_refused(tmp_path):
    state = static_model().state_dict()
    with pytest.raises(
        ValueError, match=r"no weight for table_name='nope'.*embedding_bags.t0.weight"
    ):
        WarmStart.from_state_dict(state, "nope")
    with pytest.raises(ValueError, match=r"holds no DynamicEmbDump checkpoint"):
        WarmStart.from_dump(tmp_path, "t0")


def test_state_of_another_optimizer_or_bad_function_rows_are_refused():
    source = WarmStart.from_tensor(torch.zeros(3, 8), state=torch.zeros(3, 2))
    with pytest.raises(
        ValueError, match=r"2 optimizer-state columns, the table's optimizer keeps 1"
    ):
        _module(source, optimizer=EmbOptimType.EXACT_ROWWISE_ADAGRAD)
    _module(source)  # SGD keeps no state: the source's is not used

    def bad(keys):
        return keys.to(torch.int32)

    with pytest.raises(ValueError, match=r"the ids function must return \(0,\) int64 rows"):
        _module(WarmStart.from_tensor(torch.zeros(3, 8), ids=bad))
    with pytest.raises(ValueError, match=r"columns \[6, 10\) must lie in \[0, 8\)"):
        WarmStart.from_tensor(torch.zeros(3, 8)).columns(6, 4)


def test_a_refused_source_leaves_the_table_as_it_was():
    table = ScoredHashTable(dim=8, capacity=64, bucket_capacity=16)
    table.find_or_insert(torch.tensor([1, 2]))
    before = table.find_entries(torch.tensor([1, 2]))[0].clone()
    with pytest.raises(ValueError, match="dim 4"):
        table.warm_start = TableFill(
            WarmStart.from_tensor(torch.zeros(3, 4)), 8, 0, torch.float32, "t"
        )
    assert table.warm_start is None and table.size() == 2
    assert torch.equal(table.find_entries(torch.tensor([1, 2]))[0], before)
