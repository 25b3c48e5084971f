"""Column slices in checkpoints: a column-wise table is saved slice by slice, and a load
gives each table of the model its columns of every saved row and their optimizer state.

A saved table is whole rows (``column_slices`` absent) or the slices of a column-wise
table: ``column_slices = [[offset, width], ...]`` in column order, one file entry each,
every slice holding the same keys in the same order (checked when the dump commits, and
again by the manifest's schema). A load reads a chunk of rows of every slice, puts the
slices' columns side by side, keeps each slice's optimizer state apart (``state.<k>``),
and the rank holding a table turns that into its own view (``for_table``):

- a slice whose columns a saved slice has exactly takes that slice's state as it is
  (a column-wise model resumes bit for bit);
- otherwise the state is first made whole: per-column state (EXACT_ADAGRAD, ADAM's two
  moments) is put side by side like the columns; a per-row state (row-wise Adagrad's
  mean of the squared gradient over the row's columns; each slice keeps its own, over
  its columns) becomes the width-weighted mean of the slices' states, which is the
  whole row's mean (up to rounding; states equal on every slice are taken as they are,
  so whole rows loaded into slices and saved again come back bit for bit);
- a slice then takes its columns of per-column state, and a per-row state whole.
"""

import torch

from dynemb.config.optimizer import OptimizerConfig, optimizer_type_of


def saved_slices(meta: dict) -> list[tuple[int, int]]:
    """``[(offset, width)]`` of a saved table's slices; one slice of every column when
    it was saved as whole rows."""
    return [tuple(s) for s in meta.get("column_slices", [[0, meta["dim"]]])]


def state_widths(optimizer: str, widths: list[int]) -> list[int]:
    """Optimizer-state columns of a row of each width in ``widths``."""
    config = OptimizerConfig(optimizer_type_of(optimizer))
    return [config.state_columns(w) for w in widths]


def per_column_groups(optimizer: str) -> int:
    """How many state columns each embedding column has (EXACT_ADAGRAD 1, ADAM 2), or 0
    when the state is per row (row-wise Adagrad) or absent (SGD)."""
    one, two = state_widths(optimizer, [1, 2])
    return one if two == 2 * one else 0


def join_states(states: list[torch.Tensor], slices: list[tuple[int, int]], optimizer: str):
    """The whole rows' state of the slices' states (each ``(n, state columns of its
    width)``, in ``slices``' order)."""
    groups = per_column_groups(optimizer)
    if groups:
        return torch.cat(
            [s[:, g * w : (g + 1) * w] for g in range(groups) for s, (_, w) in zip(states, slices)],
            dim=1,
        )
    first = states[0]
    if all(torch.equal(first, s) for s in states[1:]):
        return first
    dim = sum(w for _, w in slices)
    mean = sum(s.float() * w for s, (_, w) in zip(states, slices)) / dim
    return mean.to(first.dtype)


def slice_state(whole: torch.Tensor, dim: int, offset: int, width: int, optimizer: str):
    """The state of columns ``[offset, offset + width)`` of whole rows of ``dim`` columns."""
    groups = per_column_groups(optimizer)
    if not groups:
        return whole
    return torch.cat(
        [whole[:, g * dim + offset : g * dim + offset + width] for g in range(groups)], dim=1
    )


def for_table(t, meta: dict, rows: dict) -> dict:
    """The received ``rows`` (whole rows' ``values``; ``state`` or per saved slice
    ``state.<k>``) as table ``t`` of this rank holds them: its columns, its state."""
    rows = dict(rows)
    slices = saved_slices(meta)
    parts = [rows.pop(f"state.{k}") for k in range(len(slices)) if f"state.{k}" in rows]
    if not t.is_slice and len(slices) == 1:
        return rows
    offset, width, dim = t.column_offset, t.table.dim, meta["dim"]
    rows["values"] = rows["values"][:, offset : offset + width].contiguous()
    if parts and (offset, width) in slices:
        rows["state"] = parts[slices.index((offset, width))]
        return rows
    whole = join_states(parts, slices, meta["optimizer"]) if parts else rows.get("state")
    if whole is not None:
        rows["state"] = slice_state(whole, dim, offset, width, meta["optimizer"]).contiguous()
    return rows


__all__ = [
    "for_table",
    "join_states",
    "per_column_groups",
    "saved_slices",
    "slice_state",
    "state_widths",
]
