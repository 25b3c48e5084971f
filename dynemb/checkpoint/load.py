"""``DynamicEmbLoad``: validate everything, then route every saved key to its owner and restore it."""

from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from dynemb.checkpoint.dump_lock import load_lock
from dynemb.checkpoint.dynamicemb_load import load_dynamicemb_layout
from dynemb.checkpoint.exchange import (
    RESTORE_THREADS,
    StepLimits,
    check_row_wise_everywhere,
    held_by,
    op_threads,
    prepare_tables,
    report_dropped,
    restore_rows,
    restored_step,
    route_rows,
    sliced_tables,
    table_holders,
    table_routes,
)
from dynemb.checkpoint.tables import NamedTable, TableNames, admission_counter, named_tables
from dynemb.config.score_strategies import score_strategy_label
from dynemb.distributed.collectives import (
    all_gather,
    process_group,
    rank_and_size,
)
from dynemb.distributed.rank_faults import DEFAULT_TIMEOUT_S, RankAgreement
from dynemb.dump_files.columns import for_table
from dynemb.dump_files.dynamicemb_layout import is_dynamicemb_layout
from dynemb.dump_files.format import CHUNK_ROWS, CheckpointError, dtype_name, read_rows
from dynemb.dump_files.manifest import MANIFEST, read_manifest
from dynemb.dump_files.saved_rows import MappedUnit, file_fields, read_units, routed_fields
from dynemb.dump_files.verify import verify_all
from dynemb.table.batches_in_flight import refuse_batches_in_flight


def _check_table(t: NamedTable, meta: dict, optim: bool, allow_optimizer_mismatch: bool) -> bool:
    """Raises CheckpointError on a mismatch; returns whether to load the optimizer state."""
    table, group = t.table, t.group
    for field, mine in (
        ("dim", t.full_dim),
        ("value_dtype", dtype_name(table.value_dtype)),
        ("score_strategy", score_strategy_label(table)),
    ):
        if meta[field] != mine:
            raise CheckpointError(
                f"table {t.name!r}: the checkpoint has {field}={meta[field]!r}, the model {mine!r}"
            )
    limits = StepLimits.of(t)
    for field, high, why in (
        ("table_step", limits.score, limits.score_rule),
        ("optimizer_step", limits.optimizer, "the next step must fit an int64"),
    ):
        if not 0 <= meta[field] <= high:
            raise CheckpointError(
                f"table {t.name!r}: the checkpoint's {field} must be in [0, {high}] ({why}), "
                f"got {meta[field]}"
            )
    if not optim:
        return False
    same = meta["optimizer"] == group.optimizer_config.optimizer.name and meta[
        "state_columns"
    ] == group.optimizer_config.state_columns(t.full_dim)
    if same:
        return True
    if allow_optimizer_mismatch:
        return False
    raise CheckpointError(
        f"table {t.name!r}: the checkpoint holds {meta['optimizer']} state "
        f"({meta['state_columns']} columns), the model trains with "
        f"{group.optimizer_config.optimizer.name}; pass allow_optimizer_mismatch=True to load rows only"
    )


def DynamicEmbLoad(  # DynamicEmb's public name
    path: str | Path,
    model: nn.Module,
    table_names: TableNames = None,
    optim: bool = False,
    counter: bool = False,
    pg: dist.ProcessGroup | None = None,
    allow_optimizer_mismatch: bool = False,
    merge: bool = False,
    fault_timeout: float = DEFAULT_TIMEOUT_S,
    strict: bool = False,
) -> None:
    """Loads a checkpoint written by DynamicEmbDump, or by NVIDIA DynamicEmb, at any world
    size and dist_type.

    A directory with ``manifest.json`` is dynemb's format (below); one without it that
    holds DynamicEmb's files (``<collection path>/<table>_emb_keys.rank_<r>.world_size_<W>``
    ...) is read as DynamicEmb's layout, with every file's size checked against the
    model's tables before any table changes (see DynamicEmb_APIs.md).

    Any plan loads into any other (see docs/guides/checkpoints-across-plans.md):
    each table may be row-wise, table-wise or column-wise, on other ranks, in the
    checkpoint and in the model. Each rank verifies and reads a share of the files
    (a column-wise table's slices together, as whole rows), sends every key to the
    rank that owns it under the model's current plan (row-wise: its routing;
    table-wise: the table's rank; column-wise: every slice's rank, which keeps its
    columns and their optimizer state, see checkpoint/columns.py), and that rank restores it
    (``ScoredHashTable.restore``) with its row, score (LFU counts exact, timestamps
    preserved) and, with ``optim=True``, its optimizer state. Every rank of ``pg``
    must call it.

    A load holds the checkpoint's dump lock shared (see DynamicEmbDump): a dump to
    ``path`` in progress finishes first, and none commits while the load reads.

    Nothing changes before everything was checked: the manifest (UTF-8, JSON, its
    checksum, its schema: types, ranges, one file entry per saved rank, plain file
    names inside the dump directory), every table's options against the model's, and
    every file (present, inside the checkpoint, size, CRC-32), on every rank.

    A load **restores** the checkpoint: each loaded table is emptied first, so keys
    stored after the dump are gone, and its score step (and, with ``optim=True``, the
    optimizer step) become the saved ones. DynamicEmb's load inserts into the tables
    as they are instead; both give the same result in a freshly built model (the
    usual case), and ``merge=True`` keeps DynamicEmb's behaviour (a chain of
    incremental checkpoints loaded one over the other).

    Args:
        path: the checkpoint directory.
        model: the model to load into (as for DynamicEmbDump).
        table_names: load these tables only (as in DynamicEmbDump: a ``{collection
            path: [table, ...]}`` dict or a list of names); default: every table of
            the checkpoint, which must be exactly the model's dynamic tables.
        optim: also load the optimizer state (and Adam's step count).
        counter: also load the admission counts (of a dump with ``counter=True``).
        pg: the process group of the model's ranks.
        allow_optimizer_mismatch: with ``optim=True``, load only the rows of a table
            whose saved state belongs to another optimizer instead of failing.
        merge: keep what the tables hold and insert the saved rows over it (a saved
            key replaces the stored one; steps become the larger of the two) instead of
            replacing the tables' content.
        fault_timeout: (several ranks) seconds after which a rank that stopped
            responding counts as dead, as in DynamicEmbDump: every other rank raises
            RankFailure naming it; a rank that raises is reported to the others at once.
        strict: raise (RuntimeError) when an evicting table dropped saved rows,
            instead of warning (CheckpointWarning).

    Rows that do not fit: a NO_EVICTION table stores what fits and the load raises
    RuntimeError naming each table and the count. An evicting table evicts: each
    rank restores its rows in batches of up to 65,536 in ascending (score, digest,
    key) order, a full bucket evicting its lowest (score, digest, key) entry, so
    each bucket keeps the highest of a batch (of the whole table when it comes in
    one batch); the load then warns (CheckpointWarning) naming each table and the
    count of rows dropped (with ``merge``, stored rows evicted count too), or, with
    ``strict=True``, raises RuntimeError. Either way the other rows are loaded.

    Raises:
        CheckpointError (a ValueError): no manifest (not a checkpoint, or never
            completed), unknown version, a damaged or invalid manifest, a table of one
            side missing on the other, a mismatched dim / dtype / score strategy /
            optimizer, a missing, truncated, corrupted or out-of-checkpoint file. The
            message names the table or the file, the value and what was expected.
            The tables are unchanged.
        RuntimeError: keys that did not fit in a NO_EVICTION table, or (``strict``)
            rows an evicting table dropped; raised after loading the rest.
        RuntimeError: a loaded table has batches in flight (a training forward whose
            backward has not run, a pending prefetch: their gradients and staged rows
            would overwrite the loaded rows); raised before any table changes.
        RankFailure (a RuntimeError): another rank failed or died; names it and its error.
        ValueError: a ``fault_timeout`` that is not a positive number.

    Example::

        DynamicEmbLoad("/ckpt/step_1000", model, optim=True)
    """
    if not isinstance(strict, bool):
        raise TypeError(f"DynamicEmbLoad: `strict` must be a bool, got {strict!r}")
    pg = process_group(pg)
    path = Path(path)
    with RankAgreement(pg, "DynamicEmbLoad", fault_timeout), load_lock(path):
        refuse_batches_in_flight(
            [(t.name, t.group.tables[t.index]) for t in named_tables(model, table_names)],
            "DynamicEmbLoad",
        )
        if not (path / MANIFEST).is_file() and is_dynamicemb_layout(path):
            what = "DynamicEmbLoad of DynamicEmb's layout"
            check_row_wise_everywhere(named_tables(model, table_names), pg, what)
            load_dynamicemb_layout(
                path, model, table_names, optim, counter, pg, allow_optimizer_mismatch, merge,
                strict,
            )  # fmt: skip
            return
        _load(path, model, table_names, optim, counter, pg, allow_optimizer_mismatch, merge, strict)


def _load(
    path: Path, model, table_names, optim, counter, pg, allow_optimizer_mismatch, merge, strict
):
    """DynamicEmbLoad of a checkpoint in dynemb's format (arguments as DynamicEmbLoad)."""
    rank, world_size = rank_and_size(pg)
    manifest = read_manifest(path)
    directory = path / manifest["dump_id"]
    tables = named_tables(model, table_names)
    saved = manifest["tables"]
    missing = [t.name for t in tables if t.name not in saved]
    if missing:
        raise CheckpointError(f"{path}: no saved table {missing} (it holds {sorted(saved)})")
    holders = table_holders(tables, pg)
    routes = table_routes(tables, pg)
    if table_names is None:
        extra = sorted(set(saved) - set(holders))
        if extra:
            raise CheckpointError(f"{path}: tables {extra} are not dynamic tables of the model")
    if optim and not manifest["optim"]:
        raise CheckpointError(f"{path}: dumped without optimizer state (optim=False)")
    local = {t.name: t for t in tables}
    reads = {}  # name -> (loads the state, keeps timestamps), decided where the table is
    for t in tables:
        with_state = _check_table(t, saved[t.name], optim, allow_optimizer_mismatch)
        reads[t.name] = (with_state, t.table.keeps_timestamps)
    for rank_reads in all_gather(reads, pg):  # ranks without a table read it for its holder
        for name, read in rank_reads.items():
            reads.setdefault(name, read)
    plans = [
        (name, saved[name], routed_fields(saved[name], *reads[name])) for name in sorted(holders)
    ]

    # Every file checked before any table changes; all ranks agree on the outcome. Each
    # rank reads a share of the units (a file entry, or a column-wise table's slices).
    units = [(name, unit) for name, meta, _ in plans for unit in read_units(meta)]
    share: dict[str, list] = {name: [] for name, _, _ in plans}
    for name, unit in units[rank::world_size]:
        share[name].append(unit)
    files = [
        (name, saved[name]["files"][i], file_fields(saved[name], i, *reads[name]))
        for name, name_units in share.items()
        for unit in name_units
        for i in unit
    ]
    errors = verify_all(directory, files)
    errors = [e for rank_errors in all_gather(errors, pg) for e in rank_errors]
    if errors:
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        raise CheckpointError(errors[0] + more)

    sliced = sliced_tables(tables, pg)
    failed = {}
    for t in tables:
        prepare_tables(t, merge, counter)
    with op_threads(RESTORE_THREADS):
        for name, meta, fields in plans:
            t = local.get(name)
            # Where its rows go: every slice's rank, or each key's owner among the ranks
            # holding the table (all of them row-wise, one table-wise, a node's
            # table-row-wise).
            if name in sliced:
                to = {"replicas": holders[name]}
            else:
                to = {"holders": held_by(holders[name], world_size, routes[name])}
            plan = (meta, reads[name], fields)
            failed_rows = _load_chunks(directory, t, plan, share[name], to, pg)
            if counter:
                _load_counter(directory, t, meta, share[name], to, pg, world_size)
            if t is None:
                continue
            # Every slice drops the same rows: the first slice's count them.
            failed[name] = failed_rows if t.column_offset == 0 else 0
            t.table.score_step = restored_step(t.table.score_step, meta["table_step"], merge)
            if reads[name][0]:
                t.group.step = restored_step(t.group.step, meta["optimizer_step"], merge)
    report_dropped(failed, tables, strict, pg)


def _load_chunks(directory: Path, t: NamedTable | None, plan: tuple, units: list, to: dict, pg):
    """Routes and restores this rank's share (``units``) of one table, chunk by chunk;
    returns the rows it dropped (restore_rows). Every rank joins every exchange, with an
    empty chunk if need be; ``t`` is None on a rank that does not hold the table.

    ``plan``: the table's ``(manifest entry, (loads the state, keeps timestamps), routed
    fields)``; ``to``: route_rows' ``holders`` or ``replicas``."""
    meta, read, fields = plan
    world_size = rank_and_size(pg)[1]
    chunks = [
        (i, begin, min(begin + CHUNK_ROWS, rows))
        for i, unit in enumerate(units)
        for rows in [meta["files"][unit[0]]["rows"]]
        for begin in range(0, rows, CHUNK_ROWS)
    ]
    rounds = max(all_gather(len(chunks), pg))
    failed, mapped = 0, None
    for k in range(rounds):
        local = None
        if k < len(chunks):
            i, begin, end = chunks[k]
            if mapped is None or mapped.index != i:  # one unit's files mapped at a time
                mapped = MappedUnit(directory, meta, units[i], read, i)
            local = mapped.rows(begin, end)
        received = route_rows(t, fields, local, pg, world_size, **to)
        if t is not None:
            failed += restore_rows(t, fields, for_table(t, meta, received))
    return failed


def _load_counter(
    directory: Path, t: NamedTable | None, meta: dict, units: list, to: dict, pg, world_size: int
) -> None:
    """Admission counts: each saved count goes to the owner of its key, like the rows
    (a column-wise table's from its first slice: every slice counts the same keys)."""
    counter = admission_counter(t) if t is not None else None
    fields = {"keys": (torch.int64, 0), "counts": (torch.int64, 0)}
    local = {"keys": [], "counts": []}
    for e in (meta["files"][unit[0]] for unit in units):
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
    received = route_rows(t, fields, local, pg, world_size, **to)
    if counter is not None and received["keys"].numel():
        counter.load(received["keys"], received["counts"])


__all__ = ["CheckpointError", "DynamicEmbLoad"]
