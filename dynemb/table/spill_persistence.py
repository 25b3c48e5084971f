"""How a spilled ScoredHashTable commits and reopens its spill directory (see
spill_files.py for the files): functions over the table's TableState
(table_state.py) and its layout."""

import torch

from dynemb.table.spill_files import SpillDirectory
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
    return storage, int(torch.count_nonzero(storage.digests)), saved["step"]
