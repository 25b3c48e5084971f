"""The positional lists that cross the op boundary are named once, in
csrc/torch/op_lists.h (and tensor_checks.h for a table's tensors): the Python side
follows the names C++ exports, field by field, so that a list reordered or extended on
one side fails here, not as a silent misreading of another field."""

import inspect

import pytest
import torch

import dynemb
from dynemb import _embedding_ops, _ops
from dynemb.optimizer import DynamicEmbOptimType, EmbOptimType, OptimizerConfig
from dynemb.table.table_storage import TableStorage


def test_the_named_tuples_follow_the_exported_lists():
    assert _ops.Policy._fields == _ops.OP_LISTS["policy"]
    assert _ops.Init._fields == _ops.OP_LISTS["init"]
    assert _ops.OptimizerArgs._fields == _ops.OP_LISTS["optimizer"]
    # The decay fields are the ones a single table's policy may leave out.
    short = _ops._CORE["policy_size_no_decay"]  # the exported rule
    assert _ops.OP_LISTS["policy"][short:] == ("half_life", "decay_step")
    # A single op's init may leave out extra_zeros, an optimizer list FTRL's fields.
    assert _ops.OP_LISTS["init"][_ops._CORE["init_size_no_zeros"] :] == ("extra_zeros",)
    # ... or stop before the rounding's fields (to nearest) or FTRL's too.
    no_rounding = _ops._CORE["optimizer_size_no_rounding"]
    assert _ops.OP_LISTS["optimizer"][no_rounding:] == ("stochastic_rounding", "rounding_seed")
    assert _ops.OP_LISTS["optimizer"][_ops._CORE["optimizer_size_no_ftrl"] : no_rounding] == (
        "learning_rate_power", "ftrl_beta", "l1_reg", "l2_reg",
    )  # fmt: skip


def test_a_tables_tensors_are_its_buffers_in_the_exported_order():
    table = dynemb.ScoredHashTable(dim=4, capacity=64, bucket_capacity=16, extra_columns=1)
    storage = table.buffers
    assert isinstance(storage, TableStorage)
    names = _ops.TABLE_TENSORS
    assert len(names) == len(set(names)) == 9
    assert all(t is getattr(storage, n) for t, n in zip(storage.tensors(), names, strict=True))


def test_the_tables_lists_are_what_the_ops_parse():
    """A table's init list and an optimizer's list, as dynemb builds them, are read by
    the ops field by field: their errors name the exported fields."""
    table = dynemb.ScoredHashTable(
        dim=4,
        capacity=64,
        bucket_capacity=16,
        extra_columns=1,
        extra_init=0.5,
        score_strategy=dynemb.DynamicEmbScoreStrategy.NO_EVICTION,
    )
    init = _ops.Init(*table.init_values)
    assert init.extra_value == 0.5 and init.column_offset == 0.0
    args = OptimizerConfig(EmbOptimType.EXACT_ROWWISE_ADAGRAD, learning_rate=0.25).kernel_args()
    assert _ops.OptimizerArgs(*args).learning_rate == 0.25
    ftrl = OptimizerConfig(DynamicEmbOptimType.FTRL, l1_reg=0.5, initial_accumulator_value=0.25)
    assert _ops.OptimizerArgs(*ftrl.kernel_args()).l1_reg == 0.5
    assert ftrl.state_init(4) == (0.25, 4)  # linear 0, then the accumulator's 0.25
    keys = torch.tensor([1, 2])
    policy = _ops.Policy(_ops.SCORE_STRATEGY_CODES["NO_EVICTION"], 0, 0, _ops.EVICT_ANY, 4)
    bad_init = list(init)[:-2]  # neither the whole list nor the one without extra_zeros
    with pytest.raises(ValueError, match=r"`init` must be \[" + ", ".join(_ops.OP_LISTS["init"])):
        _ops.table_find_or_insert_slots(table.buffers.tensors(), policy, bad_init, keys, None)


def test_no_wrapper_restates_a_list_by_hand():
    """The wrappers' docstrings name the lists, not their sizes or fields by position."""
    for module in (_ops, _embedding_ops):
        text = inspect.getsource(module)
        for stale in ("eight tensors", "[mode, a, b,", "[strategy, batch_value,", "6t"):
            assert stale not in text, f"{module.__name__} restates a list: {stale!r}"
