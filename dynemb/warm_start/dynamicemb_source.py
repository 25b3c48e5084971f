"""Reads one table of a checkpoint in NVIDIA DynamicEmb's layout (dynemb's
``DynamicEmbDump(..., format="dynamicemb")``, or DynamicEmb's own dump) whole, for a
warm start. The files are headerless: a row's widths (embedding, scores, optimizer
state) come from the sizes of a saved rank's files, then every file is checked
against them (dynemb.dump_files.dynamicemb_layout.validate_table) before a row is read.
"""

from pathlib import Path

import torch

from dynemb.dump_files.dynamicemb_layout import (
    FIELDS,
    continuous_keys,
    file_name,
    key_rows,
    read_field,
    read_opt_args,
    saved_tables,
    validate_table,
)
from dynemb.dump_files.format import CheckpointError


def _find(path: Path, table_name: str) -> tuple[str, str]:
    """``(collection, table)`` named by ``table_name``: the table, or ``<collection>.<table>``."""
    saved = saved_tables(path)
    found = [(c, t) for c, t in saved if table_name in (t, f"{c}.{t}")]
    if len(found) != 1:
        what = "no saved table" if not found else f"several saved tables {sorted(found)}"
        raise ValueError(
            f"WarmStart.from_dump: {what} for table_name={table_name!r} in {path} (it holds "
            f"{sorted(f'{c}.{t}' for c, t in saved)}); pass '<collection>.<table>'"
        )
    return found[0]


def _columns(file: Path, rows: int, element: int, keys_file: Path) -> int:
    """Columns of ``element`` bytes in the ``rows`` rows of ``file`` (0 if there is none).

    Raises:
        CheckpointError: a size that is not whole rows, naming the file and both sizes.
    """
    if not file.is_file():
        return 0
    size, row_bytes = file.stat().st_size, rows * element
    if size % row_bytes:
        whole = size - size % row_bytes
        raise CheckpointError(
            f"{file}: {size} bytes, expected a multiple of {row_bytes} ({rows} rows, as "
            f"{keys_file.name} implies, e.g. {whole} or {whole + row_bytes}): truncated or "
            "extended"
        )
    return size // row_bytes


def _widths(directory: Path, table: str) -> tuple[int, int, int]:
    """``(dim, score columns, state columns)`` from the first saved rank with rows.

    Raises:
        CheckpointError: a keys file that is not whole int64 keys, or a file of that
            rank whose size is not whole rows, naming the file and both sizes.
    """
    for keys_file in sorted(directory.glob(f"{table}_emb_keys.rank_*")):
        rows, error = key_rows(keys_file)
        if error:
            raise CheckpointError(error)
        if not rows:
            continue
        rank, world = keys_file.name.split(".rank_")[1].split(".world_size_")
        files = {f: directory / file_name(table, f, int(rank), int(world)) for f in FIELDS}
        return (
            _columns(files["values"], rows, 4, keys_file),
            _columns(files["scores"], rows, 8, keys_file),
            _columns(files["state"], rows, 4, keys_file),
        )
    raise ValueError(f"WarmStart.from_dump: table {table!r} of {directory} holds no rows")


def read_dynamicemb_table(path: Path, table_name: str, optim: bool, num_embeddings: int | None):
    """``(keys, values, state or None, optimizer step or None)`` of a table in
    DynamicEmb's layout under ``path`` (as dump_source.read_table; the step: opt_args'
    ``iters``, 0 if absent, given with the state). Under ``dist_type="continuous"`` (in
    the table's opt_args.json) a saved rank holds local ids: ``num_embeddings`` (the
    dumping model's) turns them back into keys.

    Raises:
        ValueError: no such table, a table without rows, or a continuous dump of
            several ranks without ``num_embeddings`` (CheckpointError for bad files).
    """
    collection, table = _find(path, table_name)
    directory = path / collection
    args, errors = read_opt_args(directory, table)
    if errors:
        raise CheckpointError(errors[0])
    dim, score_width, state_columns = _widths(directory, table)
    state_columns = state_columns if optim else 0
    saved, errors = validate_table(directory, table, dim, score_width, state_columns, False)
    if errors:
        raise CheckpointError(errors[0])
    continuous = (args or {}).get("dist_type") == "continuous" and saved.world_size > 1
    if continuous and num_embeddings is None:
        raise ValueError(
            f"WarmStart.from_dump: table {table!r} of {directory} was dumped by "
            f"{saved.world_size} ranks under dist_type 'continuous' (local ids): pass "
            f"num_embeddings (the dumping model's table size)"
        )
    keys, values, state = [], [], []
    for shard in saved.shards:
        ids = read_field(shard, "keys", 0, shard.rows, 0)
        if continuous:
            ids = continuous_keys(ids, shard.rank, saved.world_size, num_embeddings)
        keys.append(ids)
        values.append(read_field(shard, "values", 0, shard.rows, dim))
        if state_columns:
            state.append(read_field(shard, "state", 0, shard.rows, state_columns))
    if not state_columns:
        return torch.cat(keys), torch.cat(values), None, None
    step = (args or {}).get("iters", 0)  # Adam's count; a dump of another optimizer has none
    return torch.cat(keys), torch.cat(values), torch.cat(state), step


__all__ = ["read_dynamicemb_table"]
