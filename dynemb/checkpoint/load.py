"""``DynamicEmbLoad``: validate everything, then route every saved key to its owner and insert."""

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from dynemb import _ops
from dynemb.checkpoint.dump import admission_counter, all_gather, process_group, rank_and_size
from dynemb.checkpoint.format import (
    CHUNK_ROWS,
    CheckpointError,
    dtype_name,
    dtype_of,
    read_manifest,
    read_rows,
    verify_field,
)
from dynemb.checkpoint.tables import NamedTable, named_tables
from dynemb.shard.routing import route_keys
from dynemb.types import DynamicEmbScoreStrategy


def _check_table(t: NamedTable, meta: dict, optim: bool, allow_optimizer_mismatch: bool) -> bool:
    """Raises CheckpointError on a mismatch; returns whether to load the optimizer state."""
    table, group = t.table, t.group
    for field, mine in (
        ("dim", table.dim),
        ("value_dtype", dtype_name(table.value_dtype)),
        ("score_strategy", str(table.score_strategy)),
    ):
        if meta[field] != mine:
            raise CheckpointError(
                f"table {t.name!r}: the checkpoint has {field}={meta[field]!r}, the model {mine!r}"
            )
    if not optim:
        return False
    same = meta["optimizer"] == group.optimizer_config.optimizer.name and meta[
        "state_columns"
    ] == group.optimizer_config.state_columns(table.dim)
    if same:
        return True
    if allow_optimizer_mismatch:
        return False
    raise CheckpointError(
        f"table {t.name!r}: the checkpoint holds {meta['optimizer']} state "
        f"({meta['state_columns']} columns), the model trains with "
        f"{group.optimizer_config.optimizer.name}; pass allow_optimizer_mismatch=True to load rows only"
    )


def _fields(meta: dict, with_state: bool, keeps_ts: bool) -> dict:
    """field -> (dtype, width) of the files this load reads."""
    value = dtype_of(meta["value_dtype"])
    fields = {"keys": (torch.int64, 0), "values": (value, meta["dim"]), "scores": (torch.int64, 0)}
    if with_state:
        fields["state"] = (value, meta["state_columns"])
    if keeps_ts:
        fields["timestamps"] = (torch.int64, 0)
    return fields


def _nbytes(dtype, width: int, rows: int) -> int:
    return torch.empty((), dtype=dtype).element_size() * max(1, width) * rows


def DynamicEmbLoad(  # noqa: N802 - DynamicEmb's public name
    path: str | Path,
    model: nn.Module,
    table_names: list[str] | None = None,
    optim: bool = False,
    pg: dist.ProcessGroup | None = None,
    allow_optimizer_mismatch: bool = False,
) -> None:
    """Loads a checkpoint written by DynamicEmbDump, at any world size and dist_type.

    Each rank verifies and reads a share of the files, sends every key to the rank
    that owns it under the model's current routing, and that rank inserts it with
    its row, score (LFU counts exact, timestamps preserved) and, with ``optim=True``,
    its optimizer state. Every file is checked (present, size, CRC-32) and every
    table's options are compared before any table changes. Every rank of ``pg``
    must call it.

    Args:
        path: the checkpoint directory.
        model: the model to load into (as for DynamicEmbDump).
        table_names: load these tables only; default: every table of the checkpoint,
            which must be exactly the model's dynamic tables.
        optim: also load the optimizer state (and Adam's step count).
        pg: the process group of the model's ranks.
        allow_optimizer_mismatch: with ``optim=True``, load only the rows of a table
            whose saved state belongs to another optimizer instead of failing.

    Raises:
        CheckpointError (a ValueError): no manifest (not a checkpoint, or never
            completed), unknown version, a table of one side missing on the other,
            a mismatched dim / dtype / score strategy / optimizer, a missing,
            truncated or corrupted file. The message names the table or the file.
        RuntimeError: keys that did not fit in the tables (after loading the rest).

    Example::

        DynamicEmbLoad("/ckpt/step_1000", model, optim=True)
    """
    pg = process_group(pg)
    rank, world_size = rank_and_size(pg)
    path = Path(path)
    manifest = read_manifest(path)
    directory = path / manifest["dump_id"]
    tables = named_tables(model, table_names)
    for t in tables:
        t.prepare_load()
    saved = manifest["tables"]
    missing = [t.name for t in tables if t.name not in saved]
    if missing:
        raise CheckpointError(f"{path}: no saved table {missing} (it holds {sorted(saved)})")
    if table_names is None:
        extra = sorted(set(saved) - {t.name for t in tables})
        if extra:
            raise CheckpointError(f"{path}: tables {extra} are not dynamic tables of the model")
    if optim and not manifest["optim"]:
        raise CheckpointError(f"{path}: dumped without optimizer state (optim=False)")
    plans = []
    for t in tables:
        meta = saved[t.name]
        with_state = _check_table(t, meta, optim, allow_optimizer_mismatch)
        plans.append((t, meta, _fields(meta, with_state, t.table._layout.keeps_timestamps)))

    # Every file checked before any table changes; all ranks agree on the outcome.
    entries = [(t.name, e) for t, meta, _ in plans for e in meta["files"]]
    share: dict[str, list] = {t.name: [] for t, _, _ in plans}
    for name, entry in entries[rank::world_size]:
        share[name].append(entry)
    jobs = [(t, fields, entry) for t, _, fields in plans for entry in share[t.name]]
    with ThreadPoolExecutor(max_workers=2) as pool:  # file reads and CRC-32 release the GIL
        errors = [
            e for found in pool.map(lambda job: _verify(directory, *job), jobs) for e in found
        ]
    errors = [e for rank_errors in all_gather(errors, pg) for e in rank_errors]
    if errors:
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        raise CheckpointError(errors[0] + more)

    failed = {}
    for t, meta, fields in plans:
        chunks = [
            (e, b, min(b + CHUNK_ROWS, e["rows"]))
            for e in share[t.name]
            for b in range(0, e["rows"], CHUNK_ROWS)
        ]
        rounds = max(all_gather(len(chunks), pg))  # every rank joins every exchange
        for k in range(rounds):
            local = _read_chunk(directory, fields, *chunks[k]) if k < len(chunks) else None
            received = _route(t, fields, local, pg, world_size)
            failed[t.name] = failed.get(t.name, 0) + _insert(t, fields, received)
        _load_counter(directory, t, share[t.name], pg, world_size)
        t.table._step = max(t.table._step, meta["table_step"])
        if "state" in fields:
            t.group.step = max(t.group.step, meta["optimizer_step"])
    lost = {name: n for name, n in failed.items() if n}
    if lost:
        raise RuntimeError(f"DynamicEmbLoad: keys did not fit in their tables (capacity): {lost}")


def _verify(directory: Path, t: NamedTable, fields: dict, entry: dict) -> list[str]:
    errors = []
    for field, (dtype, width) in fields.items():
        try:
            if field not in entry["fields"]:
                raise CheckpointError(f"{directory}: table {t.name!r} has no {field} file")
            verify_field(directory, entry["fields"][field], _nbytes(dtype, width, entry["rows"]))
        except CheckpointError as e:
            errors.append(str(e))
    for field in ("counter_keys", "counter_counts"):
        if field in entry["fields"]:
            try:
                verify_field(directory, entry["fields"][field], 8 * entry["counter_rows"])
            except CheckpointError as e:
                errors.append(str(e))
    return errors


def _load_counter(directory: Path, t: NamedTable, entries: list, pg, world_size: int) -> None:
    """Admission counts: each saved count goes to the owner of its key, like the rows."""
    counter = admission_counter(t)
    fields = {"keys": (torch.int64, 0), "counts": (torch.int64, 0)}
    local = {"keys": [], "counts": []}
    for e in entries:
        if counter is not None and "counter_keys" in e["fields"]:
            n = e["counter_rows"]
            local["keys"].append(
                read_rows(directory, e["fields"]["counter_keys"], 0, n, torch.int64, 0)
            )
            local["counts"].append(
                read_rows(directory, e["fields"]["counter_counts"], 0, n, torch.int64, 0)
            )
    has_counter = max(all_gather(counter is not None, pg))  # the same collectives everywhere
    if not has_counter:
        return
    local = {f: torch.cat(v) if v else torch.empty(0, dtype=torch.int64) for f, v in local.items()}
    received = _route(t, fields, local, pg, world_size)
    if counter is not None and received["keys"].numel():
        counter.load(received["keys"], received["counts"])


def _read_chunk(directory: Path, fields: dict, entry: dict, begin: int, end: int) -> dict:
    return {
        f: read_rows(directory, entry["fields"][f], begin, end, dtype, width)
        for f, (dtype, width) in fields.items()
    }


def _route(t: NamedTable, fields: dict, local: dict | None, pg, world_size: int) -> dict:
    """Sends each key of ``local`` (and its fields) to the rank that owns it now."""
    if local is None:
        local = {f: torch.empty((0, w) if w else (0,), dtype=d) for f, (d, w) in fields.items()}
    if world_size == 1:
        return local
    routing = getattr(t.group, "routing", None)
    dist_type, num_embeddings = routing[t.index] if routing else ("roundrobin", 0)
    owner, _ = route_keys(local["keys"], dist_type, world_size, num_embeddings)
    order = torch.argsort(owner, stable=True)
    send_counts = torch.bincount(owner, minlength=world_size)
    recv_counts = torch.empty_like(send_counts)
    dist.all_to_all_single(recv_counts, send_counts, group=pg)
    send, recv = send_counts.tolist(), recv_counts.tolist()
    out = {}
    for f, (dtype, width) in fields.items():
        # Rows travel as int64 words (gloo moves every dtype that way).
        rows = local[f][order].reshape(len(order), max(1, width)).view(torch.uint8)
        pad = (-rows.shape[1]) % 8
        words = torch.nn.functional.pad(rows, (0, pad)).contiguous().view(torch.int64)
        got = torch.empty((sum(recv), words.shape[1]), dtype=torch.int64)
        dist.all_to_all_single(got, words, recv, send, group=pg)
        raw = got.view(torch.uint8)[:, : rows.shape[1]].contiguous().view(dtype)
        out[f] = raw.view(sum(recv), width) if width else raw.view(-1)
    return out


def _insert(t: NamedTable, fields: dict, rows: dict) -> int:
    """Inserts the received rows with their exact scores; returns the keys that failed."""
    table = t.table
    keys = rows["keys"]
    if keys.numel() == 0:
        return 0
    values = torch.cat([rows["values"], rows["state"]], 1) if "state" in fields else rows["values"]
    customized = table.score_strategy == DynamicEmbScoreStrategy.CUSTOMIZED
    stats = table.insert_or_assign(
        keys, values.contiguous(), rows["scores"] if customized else None
    )
    storage = table._storage
    with table._lock.write():
        slots = _ops.table_find_slots(storage.tensors(), keys)
        ok = slots >= 0
        if table._layout.keeps_scores:
            storage.scores[slots[ok]] = rows["scores"][ok]
        if "timestamps" in rows:
            storage.timestamps[slots[ok]] = rows["timestamps"][ok]
    return stats.failed


__all__ = ["CheckpointError", "DynamicEmbLoad"]
