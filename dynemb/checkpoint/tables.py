"""The dynamic tables of a model, by a name that does not depend on the world size."""

import dataclasses

from torch import nn

from dynemb.kernel.batched_dynamic_embedding_tables import BatchedDynamicEmbeddingTables
from dynemb.shard.sharded_modules import collection_path, dynamic_kernels_by_path
from dynemb.table.scored_hash_table import ScoredHashTable
from dynemb.tiering.cached_table import CachedTable


@dataclasses.dataclass
class NamedTable:
    """One dynamic table of this rank: ``name`` is ``<collection path>.<table>``."""

    name: str
    group: BatchedDynamicEmbeddingTables
    index: int

    @property
    def table(self) -> ScoredHashTable:
        """The table to dump or load: in caching mode its slow tier, after the cache
        wrote its rows back (so it holds the whole table)."""
        return persistent(self.group.tables[self.index])

    def prepare_load(self) -> None:
        """Caching mode: empties the cache into the slow tier, which the load fills."""
        table = self.group.tables[self.index]
        if isinstance(table, CachedTable):
            table.empty_cache()


def persistent(table) -> ScoredHashTable:
    """``table``, or the slow tier of a CachedTable after a sync."""
    return table.persistent_table() if isinstance(table, CachedTable) else table


def named_tables(model: nn.Module, table_names=None) -> list[NamedTable]:
    """Every dynamic table of ``model`` on this rank, sorted by name.

    ``model``: a (DMP-)sharded model, or a BatchedDynamicEmbeddingTables.
    ``table_names``: keep these only; each may be the full name or the bare table
    name when that is unambiguous. Unknown names raise ValueError.
    """
    if isinstance(model, BatchedDynamicEmbeddingTables):
        groups = [("", model)]
    else:
        groups = [(collection_path(path), g) for path, g in dynamic_kernels_by_path(model)]
    found = [
        NamedTable(f"{path}.{name}" if path else name, group, i)
        for path, group in groups
        for i, name in enumerate(group.table_names)
    ]
    found.sort(key=lambda t: t.name)
    if table_names is None:
        return found
    chosen = []
    for wanted in table_names:
        matches = [t for t in found if t.name == wanted or t.name.endswith("." + wanted)]
        if len(matches) != 1:
            known = ", ".join(t.name for t in found) or "none"
            why = "is ambiguous" if matches else "is not a dynamic table of the model"
            raise ValueError(f"table_names: {wanted!r} {why} (dynamic tables: {known})")
        chosen.append(matches[0])
    return sorted({id(t): t for t in chosen}.values(), key=lambda t: t.name)
