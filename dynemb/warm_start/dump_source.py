"""Reads one table of a ``DynamicEmbDump`` checkpoint (dynemb's format; NVIDIA
DynamicEmb's layout in dynamicemb_source.py) whole, for a
warm start: the rows of every saved rank, whatever the world size that wrote them
(a key is saved by one rank only), and their optimizer state when the dump has it.

The checkpoint is checked as a load checks it (manifest schema and checksum, file
sizes and CRC-32) before a row is read; the rows are then held in memory.
"""

from pathlib import Path

import torch

from dynemb.checkpoint.dynamicemb_layout import is_dynamicemb_layout
from dynemb.checkpoint.format import CheckpointError, dtype_of, read_rows
from dynemb.checkpoint.manifest import MANIFEST, read_manifest
from dynemb.checkpoint.verify import verify_all
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
    ``table_name`` of the dump at ``path``; ``state`` is None when the dump holds no
    optimizer state, the optimizer keeps none, or ``optim`` is False. A directory in
    NVIDIA DynamicEmb's layout is read by dynamicemb_source.py (``num_embeddings``:
    see there).

    Raises:
        ValueError: ``path`` holds no dynemb dump, or no such table (CheckpointError,
            a ValueError, for a damaged dump).
    """
    path = Path(path)
    if not (path / MANIFEST).is_file():
        if is_dynamicemb_layout(path):
            return read_dynamicemb_table(path, table_name, optim, num_embeddings)
        raise ValueError(
            f"WarmStart.from_dump: {path} holds no DynamicEmbDump checkpoint (no {MANIFEST}, "
            f"no DynamicEmb key files)"
        )
    manifest = read_manifest(path)
    name = find_table(manifest["tables"], table_name, path)
    meta = manifest["tables"][name]
    value = dtype_of(meta["value_dtype"])
    fields = {"keys": (torch.int64, 0), "values": (value, meta["dim"])}
    with_state = bool(optim and manifest["optim"] and meta["state_columns"])
    if with_state:
        fields["state"] = (value, meta["state_columns"])
    directory = path / manifest["dump_id"]
    errors = verify_all(directory, [(name, meta, fields)], {name: meta["files"]})
    if errors:
        raise CheckpointError(errors[0])
    parts: dict[str, list] = {field: [] for field in fields}
    for entry in meta["files"]:
        for field, (dtype, width) in fields.items():
            parts[field].append(
                read_rows(directory, entry["fields"][field], 0, entry["rows"], dtype, width)
            )
    cat = {field: torch.cat(p) for field, p in parts.items()}
    return cat["keys"], cat["values"], cat.get("state")


__all__ = ["find_table", "read_dumped_table"]
