"""How a spilled ScoredHashTable commits and reopens its spill directory (see
spill_files.py for the files): functions over the table's TableState
(table_state.py) and its layout."""

import torch

from dynemb import _ops
from dynemb.table.spill_files import UPGRADABLE_VERSION, SpillDirectory
from dynemb.table.table_state import TableState
from dynemb.table.table_storage import TableLayout, TableStorage


def spill_meta(dim: int, layout: TableLayout, strategy: int, max_buckets: int) -> dict:
    """What a spill directory records of the table's arguments (reopening checks them)."""
    return {
        "dim": dim,
        "row_width": layout.row_width,
        "bucket_capacity": layout.bucket_capacity,
        "value_dtype": str(layout.value_dtype),
        "strategy": strategy,
        "max_buckets": max_buckets,
        "fast_rows": layout.fast_rows,
    }


def commit_spill(state: TableState) -> None:
    """Makes the spill directory hold the table as it is (the caller holds the write
    lock, or owns the table alone)."""
    storage = state.storage
    storage.sync()
    meta = {"num_buckets": storage.num_buckets, "generation": storage.generation}
    meta["step"] = state.step
    layout = spill_meta(state.dim, state.layout, state.strategy, state.max_buckets)
    state.spill.write_meta({"layout": layout, "state": meta})
    state.spill.remove_generations_except(storage.generation)


def reopen(
    spill: SpillDirectory, meta: dict, want: dict, layout: TableLayout
) -> tuple[TableStorage, int, int]:
    """The storage a spill directory holds (``meta``, read from it), with its size and
    step. ``want``: ``spill_meta`` of the table's arguments, which must match.

    Raises:
        ValueError: the directory holds a table of other arguments (naming the first).
    """
    for name, value in want.items():
        if meta["layout"].get(name) != value:
            raise ValueError(
                f"spill directory {spill.path!r} holds a table with {name}="
                f"{meta['layout'].get(name)!r}, these arguments give {name}={value!r}"
            )
    saved = meta["state"]
    storage = TableStorage(layout, saved["num_buckets"], spill, saved["generation"], reopen=True)
    if meta["version"] == UPGRADABLE_VERSION:
        _upgrade(spill, meta, storage)
    return storage, int(torch.count_nonzero(storage.digests)), saved["step"]


def _upgrade(spill: SpillDirectory, meta: dict, storage: TableStorage) -> None:
    """Converts a directory of UPGRADABLE_VERSION to FORMAT_VERSION in place: that
    version did not record which buckets had a slot erased, so every bucket gets the
    flag (its lookups then read the whole bucket, as they did), and the metadata is
    committed with the new version. An interrupted conversion, repeated, gives the same."""
    storage.overflow.bitwise_or_(_ops.HOLED_FLAG)
    storage.sync()
    spill.write_meta({k: v for k, v in meta.items() if k != "version"})
