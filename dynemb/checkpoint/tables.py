"""The dynamic tables of a model, by a name that does not depend on the world size."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from torch import nn

from dynemb.table.scored_hash_table import ScoredHashTable
from dynemb.table_groups import collection_path, public_collection_path, table_groups

if TYPE_CHECKING:  # annotations only: groups are found by protocol, not class
    from dynemb.tbe.batched_dynamic_embedding_tables import BatchedDynamicEmbeddingTables

TableNames = Mapping[str, Sequence[str]] | Sequence[str] | None
"""``table_names`` of DynamicEmbDump / DynamicEmbLoad: DynamicEmb's ``{collection path:
[table, ...]}`` (collections not listed: every table), or a list of names."""


@dataclasses.dataclass
class NamedTable:
    """One dynamic table of this rank: ``name`` is ``<collection path>.<table>``
    (``collection`` the path without wrappers, ``""`` for the model itself)."""

    name: str
    group: BatchedDynamicEmbeddingTables
    index: int
    collection: str = ""

    @property
    def table_name(self) -> str:
        """The table's own name (its TorchRec config name)."""
        return self.group.table_names[self.index]

    @property
    def public_collection(self) -> str:
        """DynamicEmb's collection path: ``"model"`` or ``"model.<collection>"``."""
        return public_collection_path(self.collection)

    @property
    def full_dim(self) -> int:
        """The width of the table's whole rows: ``table.dim``, or more for a column slice."""
        full = self.group.full_dims
        return full[self.index] if full is not None else self.group.dims[self.index]

    @property
    def column_offset(self) -> int:
        """The first of the whole rows' columns this rank holds (0 but for a slice)."""
        return self.group.table_options[self.index].column_offset

    @property
    def is_slice(self) -> bool:
        """Whether this rank holds some columns of the table's rows only (column-wise)."""
        return self.full_dim != self.group.dims[self.index]

    @property
    def table(self) -> ScoredHashTable:
        """The table to dump or load: in caching mode its slow tier, after the cache
        wrote its rows back (so it holds the whole table)."""
        return self.group.tables[self.index].persistent_table()

    def prepare_load(self) -> None:
        """Caching mode: empties the cache into the slow tier, which the load fills."""
        self.group.tables[self.index].empty_cache()


class CollectionGroups(nn.Module):
    """Groups of dynamic tables outside a sharded model, under the collection path
    each would have in one (``""``: the model itself, else e.g. ``"sparse.ebc"``):
    what a checkpoint of a sharded model is read into by a module that holds its
    tables itself (dynemb.inference.exportable_tables)."""

    def __init__(self, groups: Mapping[str, BatchedDynamicEmbeddingTables]) -> None:
        super().__init__()
        self.groups = dict(groups)  # not submodules: the groups belong to the caller

    def dynamic_table_groups(self) -> list[tuple[str, BatchedDynamicEmbeddingTables]]:
        """The groups given, at their paths (dynemb.table_groups' protocol)."""
        return list(self.groups.items())


def named_tables(model: nn.Module, table_names=None) -> list[NamedTable]:
    """Every dynamic table of ``model`` on this rank, sorted by name.

    ``model``: a (DMP-)sharded model, a module holding BatchedDynamicEmbeddingTables
    (or one), or CollectionGroups (dynemb.table_groups finds the tables).
    ``table_names``: keep these only; each may be the full name or the bare table
    name when that is unambiguous. Unknown names raise ValueError.
    """
    groups = [(collection_path(path), g) for path, g in table_groups(model)]
    found = [
        NamedTable(f"{path}.{name}" if path else name, group, i, path)
        for path, group in groups
        for i, name in enumerate(group.table_names)
    ]
    found.sort(key=lambda t: t.name)
    if table_names is None:
        return found
    if isinstance(table_names, Mapping):
        return _by_collection(found, table_names)
    chosen = []
    for wanted in table_names:
        matches = [t for t in found if t.name == wanted or t.name.endswith("." + wanted)]
        if len(matches) != 1:
            known = ", ".join(t.name for t in found) or "none"
            why = "is ambiguous" if matches else "is not a dynamic table of the model"
            raise ValueError(f"table_names: {wanted!r} {why} (dynamic tables: {known})")
        chosen.append(matches[0])
    return sorted({id(t): t for t in chosen}.values(), key=lambda t: t.name)


def _by_collection(found: list[NamedTable], table_names: Mapping) -> list[NamedTable]:
    """DynamicEmb's ``{collection path: [tables]}``: listed collections keep the listed
    tables, the others every table."""
    paths = {t.public_collection for t in found}
    for path, names in table_names.items():
        if path not in paths:
            raise ValueError(
                f"table_names: unknown collection {path!r} (collections: {sorted(paths)})"
            )
        known = {t.table_name for t in found if t.public_collection == path}
        unknown = sorted(set(names) - known)
        if unknown:
            raise ValueError(
                f"table_names[{path!r}]: {unknown} are not dynamic tables of that collection "
                f"(it has {sorted(known)})"
            )
    return [
        t
        for t in found
        if t.public_collection not in table_names
        or t.table_name in table_names[t.public_collection]
    ]


def admission_counter(t: NamedTable):
    """The admission counter of the table on this rank, or None."""
    counters = getattr(t.group, "admission_counters", None)
    return counters[t.index] if counters else None
