"""How a checkpoint load turns saved rows into a table's view (dynemb.dump_files.columns):
a slice's columns and optimizer state out of whole rows, whole rows out of slices, for
every optimizer's state layout and slices of unequal widths; the oracle is the state
layout of core/optimizer_rules.h written out by hand."""

from types import SimpleNamespace

import pytest
import torch

from dynemb.dump_files.columns import for_table, join_states, per_column_groups, slice_state

SLICES = [(0, 3), (3, 5)]  # unequal widths: a whole row of 8 columns
DIM = 8


def test_state_layouts():
    assert per_column_groups("EXACT_SGD") == 0  # no state
    assert per_column_groups("EXACT_ROWWISE_ADAGRAD") == 0  # one column per row
    assert per_column_groups("EXACT_ADAGRAD") == 1
    assert per_column_groups("ADAM") == 2  # m, then v


@pytest.mark.parametrize("optimizer, groups", [("EXACT_ADAGRAD", 1), ("ADAM", 2)])
def test_per_column_state_slices_and_joins_exactly(optimizer, groups):
    whole = torch.randn(5, groups * DIM, generator=torch.Generator().manual_seed(1))
    parts = [slice_state(whole, DIM, o, w, optimizer) for o, w in SLICES]
    for (o, w), part in zip(SLICES, parts):  # group g of the slice: columns o..o+w of g
        want = torch.cat([whole[:, g * DIM + o : g * DIM + o + w] for g in range(groups)], 1)
        assert torch.equal(part, want)
    assert torch.equal(join_states(parts, SLICES, optimizer), whole)


def test_row_state_joins_as_the_width_weighted_mean():
    g = torch.Generator().manual_seed(2)
    s0, s1 = torch.rand(6, 1, generator=g), torch.rand(6, 1, generator=g)
    joined = join_states([s0, s1], SLICES, "EXACT_ROWWISE_ADAGRAD")
    want = (3 * s0.double() + 5 * s1.double()) / DIM
    torch.testing.assert_close(joined.double(), want, rtol=1e-6, atol=0)
    same = join_states([s0, s0.clone()], SLICES, "EXACT_ROWWISE_ADAGRAD")
    assert torch.equal(same, s0)  # equal states: as they are, bit for bit
    assert torch.equal(slice_state(s0, DIM, 3, 5, "EXACT_ROWWISE_ADAGRAD"), s0)


def _table(offset: int, width: int, full: int = DIM):
    return SimpleNamespace(
        is_slice=width != full, column_offset=offset, table=SimpleNamespace(dim=width)
    )


def _meta(slices=None) -> dict:
    meta = {"dim": DIM, "optimizer": "ADAM"}
    if slices is not None:
        meta["column_slices"] = [list(s) for s in slices]
    return meta


def test_for_table_gives_each_table_its_view():
    g = torch.Generator().manual_seed(3)
    keys = torch.arange(4)
    values = torch.randn(4, DIM, generator=g)
    state = torch.randn(4, 2 * DIM, generator=g)
    whole = {"keys": keys, "values": values, "state": state}
    # Whole rows into a whole table: untouched.
    assert torch.equal(for_table(_table(0, DIM), _meta(), whole)["state"], state)
    # Whole rows into the slice of columns 3..8: its columns and its moments.
    got = for_table(_table(3, 5), _meta(), whole)
    assert torch.equal(got["values"], values[:, 3:])
    assert torch.equal(got["state"], torch.cat([state[:, 3:DIM], state[:, DIM + 3 :]], 1))
    # Slices as saved ("state.<k>"): a slice of the same columns takes its own state
    # as it is; a whole table takes them joined.
    parts = [slice_state(state, DIM, o, w, "ADAM") for o, w in SLICES]
    saved = {"keys": keys, "values": values, "state.0": parts[0], "state.1": parts[1]}
    mine = parts[1] + 1  # a slice's own state, not the whole rows' (a trained slice)
    got = for_table(_table(3, 5), _meta(SLICES), {**saved, "state.1": mine})
    assert torch.equal(got["state"], mine) and torch.equal(got["values"], values[:, 3:])
    got = for_table(_table(0, DIM), _meta(SLICES), saved)
    assert torch.equal(got["state"], state) and torch.equal(got["values"], values)
    assert not any(f.startswith("state.") for f in got)
    # Into other columns (4..8 of slices 0..3, 3..8): made whole, then sliced.
    got = for_table(_table(4, 4), _meta(SLICES), saved)
    assert torch.equal(got["values"], values[:, 4:])
    assert torch.equal(got["state"], torch.cat([state[:, 4:DIM], state[:, DIM + 4 :]], 1))
