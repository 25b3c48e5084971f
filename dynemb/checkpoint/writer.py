"""``DynamicEmbDump``: every rank writes its shard of every dynamic table, then one atomic commit."""

import contextlib
import errno
import shutil
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from dynemb.checkpoint.dump_lock import (
    committed_dump_id,
    dump_lock,
    holds_checkpoint,
    remove_superseded_dumps,
)
from dynemb.checkpoint.dynamicemb_dump import prepare_directory, write_table
from dynemb.checkpoint.exchange import check_row_wise_everywhere
from dynemb.checkpoint.tables import NamedTable, TableNames, admission_counter, named_tables
from dynemb.config.score_strategies import score_strategy_label
from dynemb.distributed.collectives import (
    all_gather,
    process_group,
    rank_and_size,
)
from dynemb.distributed.rank_faults import (
    DEFAULT_TIMEOUT_S,
    RankAgreement,
    RankFailure,
    collective,
)
from dynemb.distributed.sharding_names import COLUMN_SLICES
from dynemb.dump_files.format import CHUNK_ROWS, FieldWriter, dtype_name, fsync_dir
from dynemb.dump_files.manifest import (
    FORMAT,
    MANIFEST,
    SLICES_VERSION,
    VERSION,
    read_manifest,
    write_manifest,
)

FORMATS = ("dynemb", "dynamicemb")


def table_meta(t: NamedTable, world_size: int) -> dict:
    """What a loader checks against its own table before loading this one: of the whole
    table (``dim``, ``state_columns``), and a slice's columns (``column_slice``)."""
    table, group = t.table, t.group
    dist_type, num_embeddings = group.table_routing(t.index)
    if dist_type == COLUMN_SLICES:  # every key on every slice; the option is kept
        dist_type = group.table_options[t.index].dist_type
    meta = {
        "dim": t.full_dim,
        "value_dtype": dtype_name(table.value_dtype),
        "optimizer": group.optimizer_config.optimizer.name,
        "state_columns": group.optimizer_config.state_columns(t.full_dim),
        "score_strategy": score_strategy_label(table),
        "bucket_capacity": table.bucket_capacity,
        "capacity_per_rank": table.max_capacity(),
        "dist_type": dist_type,
        "num_embeddings": num_embeddings,
        "world_size": world_size,
        "optimizer_step": group.step,
        "table_step": table.score_step,
    }
    if t.is_slice:
        meta["column_slice"] = [t.column_offset, table.dim]
    return meta


def _write_table(t: NamedTable, directory: Path, rank: int, optim: bool, counter: bool) -> dict:
    table = t.table
    keeps_ts = table.keeps_timestamps
    fields = (
        ["keys", "values", "scores"]
        + (["state"] if optim else [])
        + (["timestamps"] if keeps_ts else [])
    )
    writers = {}
    try:
        for f in fields:
            writers[f] = FieldWriter(directory / f"{t.name}.r{rank}.{f}")
        rows = _write_rows(table, writers, optim, keeps_ts)
        closed = {f: w.close() for f, w in writers.items()}
    except BaseException:
        for w in writers.values():
            w.abort()
        raise
    entry = {"rank": rank, "rows": rows, "fields": closed}
    counts_of = admission_counter(t) if counter else None
    if counts_of is not None:  # admission counts, with counter=True
        keys, counts = counts_of.dump()
        for field, values in (("counter_keys", keys), ("counter_counts", counts)):
            writer = FieldWriter(directory / f"{t.name}.r{rank}.{field}")
            writer.write(values.to(torch.int64))
            entry["fields"][field] = writer.close()
        entry["counter_rows"] = keys.numel()
    return entry


def _write_rows(table, writers: dict, optim: bool, keeps_ts: bool) -> int:
    """Streams the table's slots into ``writers``; returns the rows written."""
    rows, offset, pending = 0, 0, None
    capacity = table.capacity()
    # Chunk k is written on `writer` while chunk k + 1 is exported; one chunk in
    # flight at most, so memory stays bounded.
    with ThreadPoolExecutor(max_workers=1) as writer:
        while offset < capacity:
            keys, values, scores, offset = table.export_batch(
                offset, CHUNK_ROWS, include_extra=optim
            )
            chunk = {"keys": keys, "values": values[:, : table.dim], "scores": scores}
            if optim:
                chunk["state"] = values[:, table.dim :]
            if keeps_ts:
                chunk["timestamps"] = table.get_timestamps(keys)
            if pending is not None:
                pending.result()
            pending = writer.submit(_write_chunk, writers, chunk)
            rows += keys.numel()
        if pending is not None:
            pending.result()
    return rows


def _write_chunk(writers: dict, chunk: dict) -> None:
    for field, values in chunk.items():
        writers[field].write(values)


def DynamicEmbDump(  # DynamicEmb's public name
    path: str | Path,
    model: nn.Module,
    table_names: TableNames = None,
    optim: bool = False,
    counter: bool = False,
    pg: dist.ProcessGroup | None = None,
    allow_overwrite: bool = False,
    format: str = "dynemb",  # the argument's documented name
    fault_timeout: float = DEFAULT_TIMEOUT_S,
) -> Path:
    """Writes every dynamic table of ``model`` to the checkpoint directory ``path``.

    Every rank writes its own shard (keys, rows, scores, and the optimizer state with
    ``optim=True``; a column-wise table's rank its slice: every key, the slice's
    columns and state), streamed in chunks into a fresh dump directory; rank 0 then
    commits by replacing ``path/manifest.json`` atomically, so an existing checkpoint
    at ``path`` stays loadable until this one is complete, and a crash leaves no half
    checkpoint that could be loaded. Every rank of ``pg`` (default: the world, or this
    process alone) must call it. ``path`` must be one directory seen by every rank.

    Dumps to one ``path`` run one at a time (rank 0 holds an advisory lock on
    ``path/.dynemb-dump.lock``, see dump_lock.py): a second dump waits for the first
    and commits after it; no dump removes a directory another is writing, nor the
    committed checkpoint. A dump that fails (a full disk, a rank that raised or died)
    removes its own directory on rank 0, commits nothing, and leaves the previous
    checkpoint as it was; the next dump starts clean.

    Args:
        path: the checkpoint directory (created if needed).
        model: a model sharded by DistributedModelParallel with dynemb's sharders, a
            sharded collection, or a BatchedDynamicEmbeddingTables.
        table_names: dump these tables only: DynamicEmb's ``{collection path:
            [table, ...]}`` (paths ``"model"``, ``"model.<module path>"``; collections
            not listed are dumped whole), or a list of ``<collection>.<table>`` / bare
            table names; default all.
        optim: also write each row's optimizer state.
        counter: also write the admission counts of tables with admission.
        pg: the process group of the model's ranks.
        allow_overwrite: replace a checkpoint already at ``path``; without it a
            non-empty ``path`` raises ``FileExistsError``.
        format: ``"dynemb"`` (default: the layout above, verified and committed
            atomically) or ``"dynamicemb"``: NVIDIA DynamicEmb's layout
            (``<path>/<collection path>/<table>_emb_keys.rank_<r>.world_size_<W>``
            ..., see DynamicEmb_APIs.md), for going back to DynamicEmb. It has no
            manifest or checksums and is written in place, not atomically.
            DynamicEmbLoad reads both.
        fault_timeout: (several ranks) seconds after which a rank
            that stopped responding (killed, out of memory) counts as dead: every
            other rank then raises RankFailure naming it, at most ``fault_timeout``
            seconds after its last heartbeat. A rank that raises is reported to the
            others at once. Default 60.

    Returns:
        ``path``.

    Raises:
        FileExistsError: ``path`` holds a checkpoint and ``allow_overwrite`` is False
            (on every rank, before anything is written; checked under the lock, so of
            two concurrent dumps to an empty path without it, the second fails).
        OSError: writing a file failed (ENOSPC, EIO...): the message names the file;
            raised on the rank that failed, the others raise RankFailure.
        RuntimeError: (rank 0; the others raise RankFailure) the column slices of a
            table hold different keys; nothing is committed.
        RankFailure (a RuntimeError): another rank failed or died; names it and its error.
        ValueError: an unknown name in ``table_names``, an unknown ``format``, a
            ``fault_timeout`` that is not a positive number.

    Example::

        DynamicEmbDump("/ckpt/step_1000", model, optim=True)
        DynamicEmbDump("/ckpt/for_dynamicemb", model, optim=True, format="dynamicemb")
    """
    if format not in FORMATS:
        raise ValueError(f"DynamicEmbDump: `format` must be one of {FORMATS}, got {format!r}")
    pg = process_group(pg)
    rank, world_size = rank_and_size(pg)
    path = Path(path)
    tables = named_tables(model, table_names)
    if format == "dynamicemb":
        with RankAgreement(pg, "DynamicEmbDump", fault_timeout):
            check_row_wise_everywhere(tables, pg, "DynamicEmbDump(format='dynamicemb')")
            # Rank 0 resolves the path once; every rank writes inside that directory.
            occupied, resolved = all_gather((holds_checkpoint(path), str(path.resolve())), pg)[0]
            if occupied and not allow_overwrite:
                raise FileExistsError(_occupied_message(path))
            _dump_dynamicemb_layout(Path(resolved), tables, optim, counter, pg)
        return path
    with RankAgreement(pg, "DynamicEmbDump", fault_timeout) as ranks:
        with contextlib.ExitStack() as rank0:  # rank 0: the lock, held to the end
            started = _start(path, allow_overwrite, rank0) if rank == 0 else None
            started = ranks.post("start", started, root=0)[0]
            if started["kind"] == "FileExistsError":
                raise FileExistsError(started["error"])
            if started["error"]:
                raise OSError(started["errno"], started["error"])
            given, path = path, Path(started["directory"])  # resolved once, by rank 0
            directory = path / started["dump_id"]
            if rank == 0:
                rank0.callback(_remove_unless_committed, path, started["dump_id"])
            try:
                mine = {
                    t.name: (
                        table_meta(t, world_size),
                        _write_table(t, directory, rank, optim, counter),
                    )
                    for t in tables
                }
            except Exception as e:  # reported to every rank, then raised here
                failure = {"error": f"{type(e).__name__}: {e}"}
                if rank != 0:
                    ranks.announce("written", failure)
                    raise
                # Rank 0 removes the directory on the way out: nobody may still write.
                with contextlib.suppress(RankFailure):
                    ranks.post("written", failure, wait_all=True)
                raise
            everyone = ranks.post("written", {"error": None, "tables": mine}, wait_all=rank == 0)
            committed = None
            if rank == 0:
                committed = _commit(
                    path, started["dump_id"], optim, [e["tables"] for e in everyone]
                )
            committed = ranks.post("committed", committed, root=0)[0]
            if committed["error"]:
                if rank == 0 and committed["errno"] is None:
                    raise RuntimeError(committed["error"])
                if rank == 0:
                    raise OSError(committed["errno"], committed["error"])
                raise RankFailure(
                    f"DynamicEmbDump: rank 0 of {world_size} failed: {committed['error']}",
                    0,
                    committed["error"],
                )
    return given


def _occupied_message(path: Path) -> str:
    return (
        f"DynamicEmbDump: {path} is not empty; pass allow_overwrite=True to replace "
        "the checkpoint there, or choose another path"
    )


def _start(path: Path, allow_overwrite: bool, stack: contextlib.ExitStack) -> dict:
    """Rank 0: resolves ``path`` (a symbolic link, or one on its way, is followed once
    here: every write goes inside the directory it leads to now), takes the lock (kept
    by ``stack``), checks the directory, removes what failed dumps left, and makes the
    dump directory; returns ``{"directory", "dump_id", "error", "kind", "errno"}``."""
    try:
        try:
            path = path.resolve()
        except RuntimeError as e:  # a loop of symbolic links
            raise OSError(errno.ELOOP, f"DynamicEmbDump: cannot resolve {path}: {e}") from e
        stack.enter_context(dump_lock(path))
        if holds_checkpoint(path) and not allow_overwrite:
            return {"error": _occupied_message(path), "kind": "FileExistsError"}
        remove_superseded_dumps(path)
        dump_id = f"dump-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:12]}"
        try:
            (path / dump_id).mkdir()
        except OSError as e:
            raise OSError(
                e.errno, f"DynamicEmbDump: cannot create {path / dump_id}: {e.strerror}"
            ) from e
    except OSError as e:
        return {"error": str(e), "kind": "OSError", "errno": e.errno}
    return {"directory": str(path), "dump_id": dump_id, "error": None, "kind": None}


def _commit(path: Path, dump_id: str, optim: bool, everyone: list) -> dict:
    """Rank 0, holding the lock, every rank's files written: writes the manifest (the
    commit point) and removes superseded dumps; returns ``{"error", "errno"}``."""
    directory = path / dump_id
    manifest = {
        "format": FORMAT,
        "version": VERSION,
        "dump_id": dump_id,
        "optim": optim,
        "tables": {},
    }
    for name in sorted({name for tables in everyone for name in tables}):
        # Every rank holds a row-wise table; one rank a table-wise table, which is saved
        # as by a world of that rank alone (its files: that rank's); each rank of a
        # column-wise table one slice, saved in column order.
        held = [tables[name] for tables in everyone if name in tables]
        meta = manifest["tables"][name] = dict(held[0][0])
        if "column_slice" in meta:
            held.sort(key=lambda h: h[0]["column_slice"][0])
            meta.pop("column_slice")
            meta["column_slices"] = [m["column_slice"] for m, _ in held]
            manifest["version"] = SLICES_VERSION
            disagree = _slices_disagree(name, [files for _, files in held])
            if disagree:
                return {"error": disagree, "errno": None}
        meta["world_size"] = len(held)
        meta["files"] = [dict(files, rank=i) for i, (_, files) in enumerate(held)]
    try:
        fsync_dir(directory)
        write_manifest(path, manifest)  # the commit point
    except OSError as e:
        return {"error": str(e), "errno": e.errno}
    remove_superseded_dumps(path, keep=dump_id)
    return {"error": None, "errno": None}


def _slices_disagree(name: str, files: list[dict]) -> str | None:
    """Why the column slices of table ``name`` do not hold the same keys in the same
    order (their keys files differ), or None. They cannot by design (see
    dynemb.shard.cw_sharding); a dump that finds otherwise commits nothing."""
    first = files[0]["fields"]["keys"]
    for i, f in enumerate(files[1:], 1):
        keys = f["fields"]["keys"]
        if (keys["bytes"], keys["crc32"]) != (first["bytes"], first["crc32"]):
            return (
                f"DynamicEmbDump: the column slices of table {name!r} hold different keys "
                f"(slice {i}'s keys file differs from slice 0's); nothing was committed"
            )
    return None


def _remove_unless_committed(path: Path, dump_id: str) -> None:
    """Rank 0, on the way out (the lock still held): a dump directory that the manifest
    does not name (the dump failed) is removed."""
    if committed_dump_id(path) != dump_id:
        shutil.rmtree(path / dump_id, ignore_errors=True)


def _dump_dynamicemb_layout(path: Path, tables: list[NamedTable], optim, counter, pg) -> None:
    if rank_and_size(pg)[0] == 0:
        path.mkdir(parents=True, exist_ok=True)
        prepare_directory(path, tables)
    if pg is not None:
        collective(dist.barrier, pg)  # the directories exist and hold no stale file
    for t in tables:
        write_table(path, t, optim, admission_counter(t) if counter else None, pg)
    if pg is not None:
        collective(dist.barrier, pg)


def committed_dump(path: Path) -> str:
    """The dump directory the manifest names (for tests and tools)."""
    return read_manifest(Path(path))["dump_id"]


__all__ = ["DynamicEmbDump", "MANIFEST", "committed_dump"]
