"""``TableFill``: a warm-start source bound to one table, applied to the keys a batch
inserts.

A training lookup of a table (a ScoredHashTable) reads the source first, under the
table's write lock and before its upsert changes anything (``read_new``): one
gather of the batch's keys the table does not hold. So a source that fails (raises,
or gives rows of the wrong shape) fails the lookup with the table as it was, and a
later lookup of those keys reads the source again. The upsert then inserts the new
keys with the initializer's rows and ``NewRows.fill_slots`` writes the rows read
into the slots of the keys whose status is INSERTED or EVICTED (inserted in the slot
of a resident it evicted). A key the source has gets its row (and its optimizer
state when the source keeps one of the table's width; otherwise the initialised
state stays); a key it lacks keeps the initializer's row. Found keys are never
read, so the source is read once per key, the first time the key is stored; only a
key the upsert then refuses (a full table) is read and not stored (and read again
by its next lookup). Keys refused by admission never reach the table.

A cached table (dynemb.tiering) reads the source in the same way, before its slot
claim, for the keys new to both of its tiers (``read``), and writes the rows read
into the cache slots (or staged rows) those keys take.
"""

import dataclasses

import torch

from dynemb import _ops
from dynemb.warm_start.sources import WarmRows, WarmStart


@dataclasses.dataclass
class NewRows:
    """The source's rows of a batch's keys, read before the batch's upsert
    (``TableFill.read_new``).

    Attributes:
        count: n, the batch's keys.
        positions: (m,) int64, positions in the batch of the keys the source has
            (not stored before the upsert).
        rows: (m, dim [+ state_columns]) their rows, in the table's dtype.
    """

    count: int
    positions: torch.Tensor
    rows: torch.Tensor

    def select(self, new: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The rows read of the keys at batch positions ``new`` ((k,) int64): ``(at,
        rows)``, the indices into ``new`` of the keys the source has and their rows."""
        row_of = torch.full((self.count,), -1, dtype=torch.int64, device=new.device)
        row_of[self.positions] = torch.arange(self.positions.numel(), device=new.device)
        r = row_of[new]
        at = torch.nonzero(r >= 0, as_tuple=True)[0]
        return at, self.rows.index_select(0, r[at])

    def fill_slots(self, storage, new: torch.Tensor, slots: torch.Tensor) -> tuple:
        """Writes the rows read of the keys at positions ``new`` ((k,) int64, the keys the
        upsert inserted) into their ``slots`` ((k,) int64) of ``storage`` (a
        TableStorage). Returns ``(at, rows)``: the positions in ``new`` written and
        their rows."""
        at, rows = self.select(new)
        if at.numel():
            storage.write_rows(slots[at], rows)
        return at, rows


class TableFill:
    """``source`` bound to a table of ``dim`` columns, ``state_columns`` optimizer-state
    columns, rows in ``value_dtype`` (table ``name``, for messages).

    Attributes:
        reads: source reads so far (one per batch with new keys).
        keys_read: keys asked of the source so far.

    Raises:
        ValueError: ``source`` is not a WarmStart, has another ``dim``, a non-floating
            dtype, or optimizer state of another width than the table's (a table
            without state ignores a source's), or reads rows of the wrong shape.
    """

    def __init__(
        self, source: WarmStart, dim: int, state_columns: int, value_dtype: torch.dtype, name: str
    ) -> None:
        check_source(name, source, dim, state_columns)
        self.source, self.dim, self.value_dtype = source, dim, value_dtype
        self.state_columns = state_columns if source.state_columns == state_columns else 0
        # A read of no key checks the shapes a source gives (a user function's, a
        # Storage's) now, before a lookup stores anything.
        probe = source.rows(torch.empty(0, dtype=torch.int64))
        if probe.values.shape != (0, dim) or probe.found.shape != (0,):
            raise ValueError(
                f"table {name!r}: warm_start gave rows {tuple(probe.values.shape)} and found "
                f"{tuple(probe.found.shape)} for no key, expected (0, {dim}) and (0,)"
            )
        self.reads = self.keys_read = 0

    def read(self, keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(positions, rows)``: the positions in ``keys`` the source has and their rows
        ((m, dim [+ state_columns]) in the table's dtype): one source read."""
        self.reads += 1
        self.keys_read += keys.numel()
        got: WarmRows = self.source.rows(keys)
        pos = torch.nonzero(got.found.to(keys.device), as_tuple=True)[0]
        values = got.values.index_select(0, pos.to(got.values.device))
        if self.state_columns:
            state = got.state.index_select(0, pos.to(got.state.device))
            values = torch.cat([values, state.to(values.device)], dim=1)
        return pos, values.to(device=keys.device, dtype=self.value_dtype)

    def read_new(self, storage, keys: torch.Tensor) -> NewRows:
        """The source's rows of the distinct ``keys`` ((n,) int64) that ``storage`` (a
        TableStorage, under its table's write lock) does not hold: read before an
        upsert of ``keys``, so that a source that fails changes nothing. No key
        missing: no read."""
        missing = torch.nonzero(_ops.table_find_slots(storage.tensors(), keys) < 0)[:, 0]
        if not missing.numel():
            empty = keys.new_empty((0, self.dim + self.state_columns), dtype=self.value_dtype)
            return NewRows(keys.numel(), missing, empty)
        pos, rows = self.read(keys[missing])
        return NewRows(keys.numel(), missing[pos], rows)


def check_source(name: str, source, dim: int, state_columns: int) -> None:
    """Raises ValueError if ``source`` cannot warm-start table ``name`` (see TableFill)."""
    if not isinstance(source, WarmStart):
        raise ValueError(
            f"table {name!r}: warm_start must be a dynemb.warm_start.WarmStart (e.g. "
            f"WarmStart.from_tensor), got {source!r}"
        )
    if source.dim != dim:
        raise ValueError(
            f"table {name!r}: warm_start rows have dim {source.dim}, the table's dim is {dim}"
        )
    if source.dtype is not None and not source.dtype.is_floating_point:
        raise ValueError(
            f"table {name!r}: warm_start rows must be floating, got dtype {source.dtype}"
        )
    if source.state_columns and state_columns and source.state_columns != state_columns:
        raise ValueError(
            f"table {name!r}: warm_start holds {source.state_columns} optimizer-state columns, "
            f"the table's optimizer keeps {state_columns}; use a source of the same optimizer "
            f"(or one without state: WarmStart.from_dump(..., optim=False))"
        )


__all__ = ["NewRows", "TableFill", "check_source"]
