"""``WarmStart``: where a dynamic table reads a key's first row from, instead of its
initializer.

A source answers one question for a batch of keys, in one gather: which of them it
has, their ``dim`` embedding columns and, when it keeps them, their optimizer-state
columns (``WarmRows``). Every source is one of four kinds:

- ``MappedRows``: a weight tensor (a static TorchRec table) and a rule from a key to
  its row: the identity (key k is row k), ``"modulo"`` (row = key mod rows, the hash
  of a static table fed raw ids) or a user function.
- ``KeyedRows``: rows with their keys (a weight with an id per row, a checkpoint);
  keys are kept sorted so a batch is found by one binary search.
- ``StorageRows``: a user ``dynemb.tiering.Storage`` (its ``find``).
- ``ColumnSlice``: columns ``[offset, offset + width)`` of another source (a
  column-wise shard's share of a whole table's rows).

``WarmStart.from_*`` build them; ``dynemb.warm_start.table_fill`` applies one to the
keys a table inserts. A key is read at its first lookup, possibly long after the
source was built: a source over tensors holds copies of them (their values at
construction), while a Storage and an ids function are called at each read.
"""

import dataclasses
from collections.abc import Callable

import torch

from dynemb.config.storage import Storage
from dynemb.warm_start.dump_source import read_table

MAPPINGS = ("identity", "modulo")


@dataclasses.dataclass
class WarmRows:
    """What a source has of a batch of n keys.

    Attributes:
        found: (n,) bool, whether the source has each key.
        values: (n, dim) rows (anything where not found).
        state: (n, state_columns) optimizer state, or None (the source keeps none).
    """

    found: torch.Tensor
    values: torch.Tensor
    state: torch.Tensor | None = None


class WarmStart:
    """A warm-start source (see the module docstring): ``dim`` columns per row, in
    ``dtype``, and ``state_columns`` optimizer-state columns (0: none kept).
    ``optimizer_step``: the optimizer step its state was trained to (a dump's, which
    a module whose table takes the state starts from, as DynamicEmbLoad restores
    it: Adam's bias correction goes on from there), or None (no state, or a source
    that does not know it).

    Example::

        >>> source = WarmStart.from_tensor(torch.randn(100, 8))      # key k -> row k
        >>> options = DynamicEmbTableOptions(dim=8, max_capacity=1024, warm_start=source)
    """

    dim: int
    dtype: torch.dtype
    state_columns: int = 0
    optimizer_step: int | None = None

    def rows(self, keys: torch.Tensor) -> WarmRows:
        """The source's rows of ``keys`` ((n,) int64, distinct), in one gather."""
        raise NotImplementedError

    def columns(self, offset: int, width: int) -> "WarmStart":
        """Columns ``[offset, offset + width)`` of this source's rows (without optimizer
        state: a column slice's state is initialised).

        Raises:
            ValueError: the columns are not inside ``[0, dim)``.
        """
        for name, value in (("offset", offset), ("width", width)):
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"WarmStart.columns: `{name}` must be an int, got {value!r}")
        if offset < 0 or width < 1 or offset + width > self.dim:
            raise ValueError(
                f"WarmStart.columns: columns [{offset}, {offset + width}) must lie in "
                f"[0, {self.dim}) (the source's dim)"
            )
        return ColumnSlice(self, offset, width)

    # ------------------------------------------------------------ constructors

    @staticmethod
    def from_tensor(
        weight: torch.Tensor,
        ids: torch.Tensor | str | Callable | None = None,
        state: torch.Tensor | None = None,
    ) -> "WarmStart":
        """A source over a (rows, dim) weight, copied (as are ``state`` and an ``ids``
        tensor): the source holds their values at this call, whatever the caller
        does to its tensors afterwards (in-place edits, training the model they came
        from). The copy takes the weight's memory once more, on its device, while the
        caller keeps the original: drop it (e.g. the static model) once the module is
        built, or move it to the CPU first. An ``ids`` function is called at each read.

        Args:
            weight: (rows, dim) floating tensor (e.g. a static table's weight).
            ids: how a key finds its row: None or ``"identity"`` (key k is row k,
                0 <= k < rows), ``"modulo"`` (row = key mod rows), a (rows,) int64
                tensor (row i holds key ``ids[i]``, distinct), or a function from (n,)
                int64 keys to (n,) int64 rows (-1 or out of range: not found). A weight
                of no rows holds no key (its table starts from its initializer).
            state: optional (rows, state_columns) optimizer state of the rows.

        Raises:
            ValueError: a weight, ids or state of the wrong shape or dtype, or a weight
                of no rows under ``"modulo"`` (no row to map a key to).
        """
        weight = _check_weight("weight", weight)
        if state is not None:
            state = _check_weight("state", state, rows=weight.shape[0])
        if isinstance(ids, torch.Tensor):
            if ids.dtype != torch.int64 or ids.shape != (weight.shape[0],):
                raise ValueError(
                    f"WarmStart: `ids` must be a ({weight.shape[0]},) int64 tensor (one key "
                    f"per row of weight), got {tuple(ids.shape)} {ids.dtype}"
                )
            return KeyedRows(ids, weight, state)
        if ids is None:
            ids = "identity"
        if not callable(ids) and ids not in MAPPINGS:
            raise ValueError(
                f"WarmStart: `ids` must be None, one of {MAPPINGS}, an int64 tensor or a "
                f"function of the keys, got {ids!r}"
            )
        if ids == "modulo" and weight.shape[0] == 0:
            raise ValueError(
                "WarmStart: `weight` must have rows under ids='modulo' (row = key mod rows), "
                f"got a {tuple(weight.shape)} tensor; an empty source: ids='identity'"
            )
        # A copy: a source is read at each key's first lookup, possibly long after, and
        # its rows must be what the caller passed (KeyedRows copies by sorting).
        return MappedRows(weight.clone(), ids, None if state is None else state.clone())

    @staticmethod
    def from_state_dict(
        state_dict: dict,
        table_name: str,
        ids: torch.Tensor | str | Callable | None = None,
    ) -> "WarmStart":
        """A source over a static table of a TorchRec ``EmbeddingBagCollection`` /
        ``EmbeddingCollection`` state dict (of the collection or of a model holding it),
        its weight copied as ``from_tensor`` copies it.

        Args:
            state_dict: the state dict.
            table_name: the table's config name (its weight is the key ending in
                ``embedding_bags.<name>.weight`` or ``embeddings.<name>.weight``), or
                the exact state-dict key.
            ids: as in ``from_tensor``.

        Raises:
            ValueError: no weight, or more than one, for ``table_name``.
        """
        if not hasattr(state_dict, "keys"):
            raise ValueError(f"WarmStart: `state_dict` must be a mapping, got {state_dict!r}")
        ends = (f"embedding_bags.{table_name}.weight", f"embeddings.{table_name}.weight")
        found = [
            k for k in state_dict.keys() if k == table_name or k == ends[0] or k == ends[1]
            or k.endswith("." + ends[0]) or k.endswith("." + ends[1])
        ]  # fmt: skip
        if len(found) != 1:
            what = "no weight" if not found else f"several weights {found}"
            raise ValueError(
                f"WarmStart.from_state_dict: {what} for table_name={table_name!r}; the state "
                f"dict holds {sorted(state_dict.keys())}"
            )
        return WarmStart.from_tensor(state_dict[found[0]], ids)

    @staticmethod
    def from_dump(
        path, table_name: str, optim: bool = True, num_embeddings: int | None = None
    ) -> "WarmStart":
        """A source over one table of a ``DynamicEmbDump`` checkpoint, written at any
        world size, in dynemb's format or NVIDIA DynamicEmb's layout: every saved row,
        with its optimizer state when the dump has it and ``optim``, and then the
        dump's optimizer step (``optimizer_step``: a module whose table takes the state
        starts from it). ``num_embeddings``: the dumping model's table size, needed
        only for DynamicEmb's layout dumped by several ranks under
        ``dist_type="continuous"`` (its files hold local ids). See
        ``dynemb.warm_start.dump_source``.

        Raises:
            ValueError: no dump at ``path``, or no table ``table_name`` in it.
            CheckpointError: a damaged dump (a ValueError too).
        """
        keys, values, state, step = read_table(path, table_name, optim, num_embeddings)
        return KeyedRows(keys, values, state, step)

    @staticmethod
    def from_storage(storage, dim: int, state_columns: int = 0) -> "WarmStart":
        """A source over a ``dynemb.tiering.Storage`` instance whose rows are ``dim``
        embedding columns followed by ``state_columns`` optimizer-state columns. The
        storage is not copied: each read calls its ``find``, so a key reads what the
        storage holds at the key's first lookup.

        Raises:
            ValueError: ``storage`` is not a Storage, or ``dim`` / ``state_columns`` not
                ints >= 1 / >= 0; when read (a lookup's new keys, before the table
                changes), a ``find`` result that is not ``(rows (n, dim +
                state_columns) floating, scores (n,) int64, found (n,) bool)`` for n
                keys, naming the storage's class and what it returned.
        """
        if not isinstance(storage, Storage):
            raise ValueError(
                f"WarmStart.from_storage: `storage` must be a Storage, got {storage!r}"
            )
        for name, value, low in (("dim", dim, 1), ("state_columns", state_columns, 0)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(
                    f"WarmStart.from_storage: `{name}` must be an int >= {low}, got {value!r}"
                )
        return StorageRows(storage, dim, state_columns)


def _check_weight(name: str, t, rows: int | None = None) -> torch.Tensor:
    if not isinstance(t, torch.Tensor) or t.dim() != 2 or not t.is_floating_point():
        got = f"a {tuple(t.shape)} {t.dtype} tensor" if isinstance(t, torch.Tensor) else repr(t)
        raise ValueError(f"WarmStart: `{name}` must be a 2-D floating tensor, got {got}")
    if rows is not None and t.shape[0] != rows:
        raise ValueError(f"WarmStart: `{name}` must have {rows} rows (weight's), got {t.shape[0]}")
    return t.detach()


def _gather(t: torch.Tensor | None, at: torch.Tensor) -> torch.Tensor | None:
    return None if t is None else torch.index_select(t, 0, at.to(t.device))


def _nothing_found(keys: torch.Tensor, values: torch.Tensor, state: torch.Tensor | None):
    """The WarmRows of a source of no rows: no key found, rows of zeros."""
    n = keys.numel()
    zeros = None if state is None else state.new_zeros((n, state.shape[1]))
    found = torch.zeros_like(keys, dtype=torch.bool)
    return WarmRows(found, values.new_zeros((n, values.shape[1])), zeros)


class MappedRows(WarmStart):
    """A weight and a rule from a key to its row (see ``WarmStart.from_tensor``)."""

    def __init__(self, weight: torch.Tensor, ids, state: torch.Tensor | None = None) -> None:
        self.weight, self.ids, self.state = weight, ids, state
        self.dim, self.dtype = weight.shape[1], weight.dtype
        self.state_columns = 0 if state is None else state.shape[1]

    def _row_of(self, keys: torch.Tensor) -> torch.Tensor:
        n = self.weight.shape[0]
        if self.ids == "identity":
            return keys
        if self.ids == "modulo":
            return torch.remainder(keys, n)
        rows = self.ids(keys)
        if (
            not isinstance(rows, torch.Tensor)
            or rows.shape != keys.shape
            or rows.dtype != torch.int64
        ):
            got = (
                f"{tuple(rows.shape)} {rows.dtype}"
                if isinstance(rows, torch.Tensor)
                else repr(rows)
            )
            raise ValueError(
                f"WarmStart: the ids function must return ({keys.numel()},) int64 rows, got {got}"
            )
        return rows

    def rows(self, keys: torch.Tensor) -> WarmRows:
        row = self._row_of(keys).to(self.weight.device)  # a function's rows checked even so
        if self.weight.shape[0] == 0:  # no row 0 to read in place of the keys not found
            return _nothing_found(keys, self.weight, self.state)
        found = (row >= 0) & (row < self.weight.shape[0])
        at = torch.where(found, row, 0)
        return WarmRows(found.to(keys.device), _gather(self.weight, at), _gather(self.state, at))


class KeyedRows(WarmStart):
    """Rows with one key each (distinct), found by binary search in the sorted keys."""

    def __init__(
        self,
        keys: torch.Tensor,
        values: torch.Tensor,
        state: torch.Tensor | None = None,
        optimizer_step: int | None = None,
    ) -> None:
        self.optimizer_step = None if state is None else optimizer_step
        order = torch.argsort(keys)
        self.keys = keys[order]
        if self.keys.numel() > 1 and bool((self.keys[1:] == self.keys[:-1]).any()):
            raise ValueError("WarmStart: the ids of the rows must be distinct")
        self.values = values[order.to(values.device)]
        self.state = None if state is None else state[order.to(state.device)]
        self.dim, self.dtype = values.shape[1], values.dtype
        self.state_columns = 0 if state is None else state.shape[1]

    def rows(self, keys: torch.Tensor) -> WarmRows:
        sorted_keys = self.keys.to(keys.device)
        if sorted_keys.numel() == 0:
            return _nothing_found(keys, self.values, self.state)
        pos = torch.searchsorted(sorted_keys, keys).clamp_(max=sorted_keys.numel() - 1)
        found = sorted_keys[pos] == keys
        return WarmRows(found, _gather(self.values, pos), _gather(self.state, pos))


class StorageRows(WarmStart):
    """A user Storage's rows: ``dim`` columns, then ``state_columns`` of state."""

    def __init__(self, storage, dim: int, state_columns: int) -> None:
        self.storage, self.dim, self.state_columns = storage, dim, state_columns
        self.dtype = None  # whatever the storage returns (checked per read)

    def rows(self, keys: torch.Tensor) -> WarmRows:
        n, width = keys.numel(), self.dim + self.state_columns
        result = self.storage.find(keys)
        if not isinstance(result, tuple | list) or len(result) != 3:
            got = (
                f"a {type(result).__name__} of {len(result)}"
                if isinstance(result, tuple | list)
                else _described(result)
            )
            self._fail(f"{got}, expected (rows, scores, found)")
        rows, scores, found = result
        # Every result checked: a wrong one would misalign the rows and their keys. The
        # dtypes of empty results are not (as a cache's checked_find).
        want_rows = (
            f"a ({n}, {width}) floating tensor (dim {self.dim} + state {self.state_columns})"
        )
        if (
            not isinstance(rows, torch.Tensor)
            or rows.shape != (n, width)
            or (n and not rows.is_floating_point())
        ):
            self._fail(f"rows {_described(rows)} for {n} keys, expected {want_rows}")
        for what, value, dtype in (("scores", scores, torch.int64), ("found", found, torch.bool)):
            if (
                not isinstance(value, torch.Tensor)
                or value.shape != (n,)
                or (n and value.dtype != dtype)
            ):
                self._fail(
                    f"{what} {_described(value)} for {n} keys, expected a ({n},) {dtype} tensor"
                )
        found = found.to(torch.bool)  # an empty one of another dtype
        state = rows[:, self.dim :] if self.state_columns else None
        return WarmRows(found, rows[:, : self.dim], state)

    def _fail(self, what: str):
        raise ValueError(
            f"WarmStart.from_storage: {type(self.storage).__name__}.find returned {what} "
            "(a Storage's find returns (rows (n, dim + state_columns) floating, scores (n,) "
            "int64, found (n,) bool))"
        )


def _described(value) -> str:
    """``value`` in an error message: a tensor's shape and dtype, else its type."""
    if isinstance(value, torch.Tensor):
        return f"a {tuple(value.shape)} {value.dtype} tensor"
    return f"a {type(value).__name__}"


class ColumnSlice(WarmStart):
    """Columns ``[offset, offset + width)`` of another source, without its state."""

    def __init__(self, source: WarmStart, offset: int, width: int) -> None:
        self.source, self.offset = source, offset
        self.dim, self.dtype, self.state_columns = width, source.dtype, 0

    def rows(self, keys: torch.Tensor) -> WarmRows:
        whole = self.source.rows(keys)
        return WarmRows(whole.found, whole.values[:, self.offset : self.offset + self.dim])


__all__ = ["ColumnSlice", "KeyedRows", "MappedRows", "StorageRows", "WarmRows", "WarmStart"]
