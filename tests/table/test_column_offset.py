"""A table of column offset k and width d holds columns [k, k + d) of wider rows: its
new rows are those columns of the rows a table of the whole width gives the same keys,
for every initializer mode and any offset (even or odd: the normal modes draw their
columns in pairs), on the lookup paths that initialise rows (an upsert, a training
lookup, an eval read of a missing key). A bad offset is refused, naming it."""

import pytest
import torch

from dynemb import (
    BatchedDynamicEmbeddingTables,
    DynamicEmbInitializerArgs,
    DynamicEmbInitializerMode,
    DynamicEmbPoolingMode,
    DynamicEmbTableOptions,
    ScoredHashTable,
    _ops,
)
from dynemb.optimizer import EmbOptimType

WHOLE = 13  # odd: the last normal pair of the whole row is cut
KEYS = torch.tensor([0, 1, -7, 12345, 2**62, -(2**63)], dtype=torch.int64)
MODES = {
    "uniform": DynamicEmbInitializerArgs(),
    "uniform_bounds": DynamicEmbInitializerArgs(lower=-3.0, upper=2.0),
    "normal": DynamicEmbInitializerArgs(mode=DynamicEmbInitializerMode.NORMAL, std_dev=0.5),
    "truncated": DynamicEmbInitializerArgs(
        mode=DynamicEmbInitializerMode.TRUNCATED_NORMAL, std_dev=1.0, lower=-0.5, upper=0.5
    ),
    "constant": DynamicEmbInitializerArgs(mode=DynamicEmbInitializerMode.CONSTANT, value=0.25),
    "debug": DynamicEmbInitializerArgs(mode=DynamicEmbInitializerMode.DEBUG),
}
SLICES = [(0, 13), (0, 4), (4, 4), (3, 5), (1, 1), (12, 1), (7, 6)]  # (offset, width)


def _table(init, dim, offset=0, extra=0):
    return ScoredHashTable(
        dim=dim, capacity=64, bucket_capacity=16, initializer=init, seed=11,
        column_offset=offset, extra_columns=extra, extra_init=0.5,
    )  # fmt: skip


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("offset, width", SLICES)
def test_a_slices_new_rows_are_the_whole_rows_columns(mode, offset, width):
    whole = _table(MODES[mode], WHOLE).find_or_insert(KEYS)
    part = _table(MODES[mode], width, offset, extra=2)
    got = part.find_or_insert(KEYS)
    assert torch.equal(got, whole[:, offset : offset + width]), (mode, offset, width)
    keys, values, _, _ = part.export_batch(0, part.capacity(), include_extra=True)
    order = torch.argsort(keys)
    assert torch.equal(values[order][:, width:], torch.full((KEYS.numel(), 2), 0.5))


def test_slices_side_by_side_are_the_whole_row():
    init = MODES["normal"]
    whole = _table(init, WHOLE).find_or_insert(KEYS)
    bounds = [0, 3, 4, 9, WHOLE]
    parts = [_table(init, b - a, a).find_or_insert(KEYS) for a, b in zip(bounds, bounds[1:])]
    assert torch.equal(torch.cat(parts, dim=1), whole)


def _module(offset, dim, training=True):
    options = DynamicEmbTableOptions(
        dim=dim, max_capacity=64, bucket_capacity=16, seed=11, column_offset=offset,
        initializer_args=MODES["normal"], eval_initializer_args=MODES["uniform_bounds"],
    )  # fmt: skip
    module = BatchedDynamicEmbeddingTables(
        [options], [0], pooling_mode=DynamicEmbPoolingMode.NONE,
        optimizer=EmbOptimType.EXACT_SGD, learning_rate=0.1,
    )  # fmt: skip
    return module.train(training)


@pytest.mark.parametrize("offset, width", [(3, 5), (4, 4)])
def test_the_lookup_module_initialises_and_reads_missing_keys_by_columns(offset, width):
    offsets = torch.arange(KEYS.numel() + 1)
    columns = slice(offset, offset + width)
    # Training lookup: new keys' rows.
    got = _module(offset, width)(KEYS, offsets)
    assert torch.equal(got, _module(0, WHOLE)(KEYS, offsets)[:, columns])
    # Eval read of keys never stored: the eval initializer's columns.
    with torch.no_grad():
        got = _module(offset, width, training=False)(KEYS, offsets)
        want = _module(0, WHOLE, training=False)(KEYS, offsets)[:, columns]
    assert torch.equal(got, want)


@pytest.mark.parametrize(
    "offset, error, match",
    [
        (-1, ValueError, "column_offset must be >= 0, got -1"),
        (1.5, TypeError, "column_offset must be an int, got 1.5"),
        (True, TypeError, "column_offset must be an int, got True"),
        (2**31 - 4, ValueError, r"column_offset \+ dim must be <= 2\*\*31"),
    ],
)
def test_a_bad_column_offset_is_refused_naming_it(offset, error, match):
    with pytest.raises(error, match=match):
        _table(MODES["uniform"], 8, offset)


def test_the_ops_refuse_an_init_list_with_a_bad_column_offset():
    table = _table(MODES["uniform"], 4)
    before = [t.clone() for t in table.buffers.tensors()]
    for bad in (0.5, -1.0, 2.0**31):
        init = table.init_values
        init[6] = bad
        policy = _ops.Policy(_ops.CACHE_SCORES, 1, table.seed, -1, table.dim)
        with pytest.raises(ValueError, match="column_offset must be a whole number in"):
            _ops.table_find_or_insert_slots(table.buffers.tensors(), policy, init, KEYS, None, None)
    assert all(torch.equal(a, b) for a, b in zip(table.buffers.tensors(), before))
