"""UNIFORM draws ``lower + (upper - lower) * u`` in float32: bounds whose width overflows
float32 (both finite) would give ``inf`` rows; they are refused."""

import pytest
import torch

import dynemb
from dynemb import DynamicEmbInitializerArgs as Args
from dynemb import DynamicEmbInitializerMode as M
from dynemb import DynamicEmbTableOptions

BIG = float(torch.finfo(torch.float32).max)
KEYS = torch.arange(1, 65)


def _table_rows(init):
    table = dynemb.ScoredHashTable(dim=8, capacity=1024, initializer=init)
    return table.find_or_insert(KEYS)


def _module(**options):
    opts = DynamicEmbTableOptions(dim=8, max_capacity=1024, **options)
    return dynemb.BatchedDynamicEmbeddingTables([opts], [0])


def _module_rows(init):
    # One feature x 64 bags of one key each: each output row is the key's new row.
    return _module(initializer_args=init)(KEYS, torch.arange(KEYS.numel() + 1))


@pytest.mark.parametrize(
    "lower, upper, got",
    [
        (-3e38, 3e38, "got inf for lower=-3e\\+38, upper=3e\\+38"),
        (-BIG, BIG, "got inf for lower=-3.4028"),
        (-2e38, 1.5e38, "got inf for lower=-2e\\+38, upper=1.5e\\+38"),
        (-BIG, None, None),  # the default upper (1 / sqrt(capacity)) rounds away
    ],
)
def test_a_width_that_overflows_float32_is_refused(lower, upper, got):
    init = Args(lower=lower, upper=upper)
    if got is None:
        assert torch.isfinite(_table_rows(init)).all()
        return
    match = "DynamicEmbInitializerArgs.upper - lower must be a finite float32 number.*" + got
    with pytest.raises(ValueError, match=match):
        dynemb.ScoredHashTable(dim=8, capacity=1024, initializer=init)
    for field in ("initializer_args", "eval_initializer_args"):
        with pytest.raises(ValueError, match=match):
            _module(**{field: init})


@pytest.mark.parametrize("rows_of", [_table_rows, _module_rows])
def test_the_widest_drawable_bounds_give_finite_rows_within_them(rows_of):
    rows = rows_of(Args(lower=-1.7e38, upper=1.7e38))
    assert torch.isfinite(rows).all()
    assert rows.min() >= -1.7e38 and rows.max() <= 1.7e38
    assert rows.min() < -1e37 and rows.max() > 1e37  # drawn across the range


@pytest.mark.parametrize("rows_of", [_table_rows, _module_rows])
def test_truncated_normal_cuts_are_not_a_width(rows_of):
    """TRUNCATED_NORMAL compares draws with each cut alone: wide cuts are fine."""
    rows = rows_of(Args(mode=M.TRUNCATED_NORMAL, lower=-3e38, upper=3e38))
    assert torch.isfinite(rows).all() and rows.abs().max() < 10
