"""Reads one table of a ``DynamicEmbDump`` checkpoint (dynemb's format; NVIDIA
DynamicEmb's layout in dynamicemb_source.py) whole, for a
warm start: the rows of every saved rank, whatever the world size and plan that wrote
them (a key is saved by one rank only; a column-wise table's slices are joined into
whole rows), and their optimizer state when the dump has it.

The checkpoint is checked as a load checks it (manifest schema and checksum, file
sizes and CRC-32) before a row is read; the rows are then held in memory.
"""

from pathlib import Path

import torch

from dynemb.dump_files.columns import join_states, saved_slices
from dynemb.dump_files.dynamicemb_layout import is_dynamicemb_layout
from dynemb.dump_files.format import CheckpointError
from dynemb.dump_files.manifest import INT64_MAX, MANIFEST, read_manifest
from dynemb.dump_files.saved_rows import MappedUnit, file_fields, read_units
from dynemb.dump_files.verify import verify_all
from dynemb.warm_start.dynamicemb_source import read_dynamicemb_table


def find_table(saved: dict, table_name: str, path: Path) -> str:
    """The manifest's name of ``table_name``: itself, or the one saved name ending in
    ``.<table_name>`` (a dump names tables ``<collection path>.<table>``)."""
    if table_name in saved:
        return table_name
    found = [name for name in saved if name.endswith("." + table_name)]
    if len(found) != 1:
        what = "no saved table" if not found else f"several saved tables {sorted(found)}"
        raise ValueError(
            f"WarmStart.from_dump: {what} for table_name={table_name!r} in {path} (it holds "
            f"{sorted(saved)}); pass the saved name"
        )
    return found[0]


def read_dumped_table(path, table_name: str, optim: bool = True, num_embeddings=None):
    """``(keys (N,) int64, values (N, dim), state (N, state_columns) or None)`` of table
    ``table_name`` of the dump at ``path`` (``read_table`` without the step)."""
    return read_table(path, table_name, optim, num_embeddings)[:3]


def read_table(path, table_name: str, optim: bool = True, num_embeddings=None) -> tuple:
    """``(keys (N,) int64, values (N, dim), state (N, state_columns) or None, step)`` of
    table ``table_name`` of the dump at ``path``; ``state`` is None when the dump holds
    no optimizer state, the optimizer keeps none, or ``optim`` is False; ``step`` is
    the dumping module's optimizer step (Adam's bias-correction count) when ``state``
    is given, else None. A directory in NVIDIA DynamicEmb's layout is read by
    dynamicemb_source.py (``num_embeddings``: see there).

    Raises:
        ValueError: ``path`` holds no dynemb dump, or no such table (CheckpointError,
            a ValueError, for a damaged dump or a step outside [0, 2**63 - 2]: the next
            step must fit an int64).
    """
    path = Path(path)
    if not (path / MANIFEST).is_file():
        if is_dynamicemb_layout(path):
            table = read_dynamicemb_table(path, table_name, optim, num_embeddings)
            return _checked_step(table, path, f"{table_name} opt_args.json iters")
        raise ValueError(
            f"WarmStart.from_dump: {path} holds no DynamicEmbDump checkpoint (no {MANIFEST}, "
            f"no DynamicEmb key files)"
        )
    manifest = read_manifest(path)
    name = find_table(manifest["tables"], table_name, path)
    meta = manifest["tables"][name]
    read = (bool(optim and manifest["optim"] and meta["state_columns"]), False)
    directory = path / manifest["dump_id"]
    files = [(name, e, file_fields(meta, i, *read)) for i, e in enumerate(meta["files"])]
    errors = verify_all(directory, files)
    if errors:
        raise CheckpointError(errors[0])
    # A unit: one rank's rows, or (column-wise) every slice's columns of the same rows.
    parts: dict[str, list] = {"keys": [], "values": [], "state": []}
    for index, unit in enumerate(read_units(meta)):
        rows = MappedUnit(directory, meta, unit, read, index).rows(
            0, meta["files"][unit[0]]["rows"]
        )
        parts["keys"].append(rows["keys"].clone())
        parts["values"].append(rows["values"].clone())
        states = [rows[f"state.{k}"] for k in range(len(unit)) if f"state.{k}" in rows]
        if states:  # the slices' states joined into the whole rows' (columns.py)
            parts["state"].append(join_states(states, saved_slices(meta), meta["optimizer"]))
        elif "state" in rows:
            parts["state"].append(rows["state"].clone())
    cat = {field: torch.cat(p) for field, p in parts.items() if p}
    step = meta["optimizer_step"] if "state" in cat else None
    table = cat["keys"], cat["values"], cat.get("state"), step
    return _checked_step(table, path, f"tables[{name!r}].optimizer_step")


def _checked_step(table: tuple, path: Path, field: str) -> tuple:
    """``table``, its step checked: the module that carries it counts one step more at
    its next update, an int64 (as DynamicEmbLoad checks it)."""
    step = table[3]
    if step is not None and (
        isinstance(step, bool) or not isinstance(step, int) or not 0 <= step < INT64_MAX
    ):
        raise CheckpointError(
            f"WarmStart.from_dump: {path}: {field} must be an integer in [0, {INT64_MAX - 1}] "
            f"(the next step must fit an int64), got {step!r}"
        )
    return table


__all__ = ["find_table", "read_dumped_table", "read_table"]
