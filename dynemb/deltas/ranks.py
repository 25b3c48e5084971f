"""The collective parts of a DeltaPublisher over several processes (any sharding type).

A row-wise table has a shard on every rank, and a key is routed to exactly one rank
(dynemb/distributed/routing.py): the ranks' changes to it are disjoint, so its delta is the
concatenation of the ranks'. A table-wise table's delta is its one rank's. Each slice
of a column-wise table stores, updates and evicts the same keys (dynemb/shard/
cw_sharding.py), so its delta is the slices' joined by key: their columns side by side
(and their optimizer state, as a checkpoint joins it: dynemb/dump_files/columns.py),
the first slice's scores and tombstones. Rank 0 gathers the ranks' changes and writes
the one delta of whole rows (the on-disk format does not depend on the sharding);
its outcome, committed or the error, is posted to every rank through the group's
store (dynemb/distributed/rank_faults.py), so every rank returns the same version or raises.
"""

import builtins
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist

from dynemb.deltas.capture import Capture, delta_bytes, entries, restore
from dynemb.deltas.commit import DeltaCommit
from dynemb.deltas.format import TableDelta, table_delta_meta
from dynemb.distributed.rank_faults import RankAgreement, RankFailure
from dynemb.dump_files.columns import join_states


def agree_on_tables(ranks: RankAgreement, pg, local_error: str | None, tables: dict) -> None:
    """Every rank's check of its own tables, and their ``{name: meta}`` (a slice's: of
    the whole table), gathered: the same ValueError on every rank if one rank's check
    failed or two ranks holding a table disagree on its meta."""
    everyone = [None] * ranks.world_size
    ranks.collective(dist.all_gather_object, everyone, (local_error, tables), pg)
    for r, (error, _) in enumerate(everyone):
        if error is not None:
            raise ValueError(error if r == ranks.rank else f"rank {r}: {error}")
    first: dict[str, tuple[int, dict]] = {}
    for r, (_, theirs) in enumerate(everyone):
        for name, meta in theirs.items():
            holder, seen = first.setdefault(name, (r, meta))
            if meta != seen:
                raise ValueError(
                    f"DeltaPublisher: table {name!r} is {meta} on rank {r}, {seen} on rank "
                    f"{holder}; every rank holding a table must hold the same table"
                )


def gather_to_rank0(ranks: RankAgreement, pg, tables: dict) -> list | None:
    """Every rank's ``{name: (meta, TableDelta, column slice)}``, in rank order, on rank
    0 (None on the others). Column views are made contiguous first: pickling a view
    would send its whole storage (the optimizer state columns too)."""
    mine = {name: (meta, _contiguous(d), piece) for name, (meta, d, piece) in tables.items()}
    out = [None] * ranks.world_size if ranks.rank == 0 else None
    ranks.collective(dist.gather_object, mine, out, 0, pg)
    return out


def column_slice(t, meta: dict, optim: bool) -> tuple[dict, tuple | None]:
    """A table's delta meta and its column slice: ``(meta of the whole table, (first
    column, width, optimizer name))`` for a slice of a column-wise table, else
    ``(meta, None)``."""
    if not t.is_slice:
        return meta, None
    config = t.group.optimizer_config
    state = config.state_columns(t.full_dim) if optim else 0
    whole = table_delta_meta(t.full_dim, t.table.value_dtype, state, meta["score_strategy"])
    return whole, (t.column_offset, t.table.dim, config.optimizer.name)


def merge(everyone: list) -> dict:
    """Rank 0: one ``{name: (meta, TableDelta)}`` of the ranks' deltas: a table's
    shards concatenated, its column slices joined."""
    merged = {}
    for name in sorted({name for tables in everyone for name in tables}):
        held = [r[name] for r in everyone if name in r]
        meta = held[0][0]
        if held[0][2] is not None:
            merged[name] = (meta, _join(name, sorted(held, key=lambda h: h[2][0])))
            continue
        parts = [d for _, d, _ in held]
        fields = {f: _cat([getattr(p, f) for p in parts]) for f in _FIELDS}
        merged[name] = (meta, TableDelta(**fields, score_strategy=parts[0].score_strategy))
    return merged


def _join(name: str, held: list) -> TableDelta:
    """A column-wise table's delta of its slices' ``(meta, TableDelta, (offset, width,
    optimizer))``, in column order: whole rows by ascending key."""
    parts = []
    for _, d, _ in held:
        order = torch.argsort(d.keys)
        parts.append(
            {f: None if getattr(d, f) is None else getattr(d, f)[order] for f in _FIELDS[:-1]}
        )
    first = parts[0]
    tombstones = [torch.sort(d.tombstones).values for _, d, _ in held]
    if any(
        not torch.equal(p["keys"], first["keys"]) or not torch.equal(t, tombstones[0])
        for p, t in zip(parts, tombstones)
    ):
        raise RuntimeError(
            f"DeltaPublisher: the column slices of table {name!r} changed different keys"
        )
    state = first["state"]
    if state is not None:
        slices = [(offset, width) for _, _, (offset, width, _) in held]
        state = join_states([p["state"] for p in parts], slices, held[0][2][2])
    return TableDelta(
        keys=first["keys"],
        values=torch.cat([p["values"] for p in parts], dim=1),
        scores=first["scores"],
        state=state,
        timestamps=first["timestamps"],
        tombstones=tombstones[0],
        score_strategy=held[0][1].score_strategy,
    )


def outcome_of(error: BaseException | None) -> dict:
    """Rank 0's write outcome, as JSON for the others (not under ``"error"``: a post
    with one makes RankAgreement raise RankFailure, not the write's own class)."""
    if error is None:
        return {"failed": None}
    builtin = isinstance(error, OSError) and getattr(builtins, type(error).__name__, None)
    return {
        "failed": f"{type(error).__name__}: {error}",
        "os_class": type(error).__name__ if builtin is type(error) else None,
        "errno": error.errno if isinstance(error, OSError) else None,
    }


def raise_outcome(outcome: dict, world_size: int) -> None:
    """On a rank other than 0: raises rank 0's write error, if any: an OSError of the
    same built-in class and errno (FileExistsError, PermissionError, ...), else
    RankFailure."""
    if outcome["failed"] is None:
        return
    message = (
        f"DeltaPublisher: rank 0 of {world_size} failed to write the delta: {outcome['failed']}"
    )
    if outcome["os_class"] is not None:
        cls = getattr(builtins, outcome["os_class"])
        raise cls(message) if outcome["errno"] is None else cls(outcome["errno"], message)
    raise RankFailure(message, 0, outcome["failed"])


_FIELDS = ("keys", "values", "scores", "state", "timestamps", "tombstones")


def _contiguous(d: TableDelta) -> TableDelta:
    fields = {f: None if getattr(d, f) is None else getattr(d, f).contiguous() for f in _FIELDS}
    return TableDelta(**fields, score_strategy=d.score_strategy)


def _cat(parts: list):
    return None if parts[0] is None else torch.cat(parts)


__all__ = [
    "agree_on_tables",
    "column_slice",
    "gather_to_rank0",
    "merge",
    "outcome_of",
    "raise_outcome",
]


def publish_collective(
    pg,
    fault_timeout: float,
    tables: list,
    capture: Capture,
    raise_failure: Callable[[], None],
    version: int,
    write: Callable[[dict], Path],
    path: Path,
) -> DeltaCommit:
    """One delta of a model sharded over the ranks of ``pg`` (DeltaPublisher.publish):
    every rank captures its shard's changes, rank 0 gathers them and ``write``s the
    merged ``{name: (meta, TableDelta)}``, and its outcome reaches every rank. On any
    failure the changes go back into the change logs on every rank. Returns the
    commit record of ``version``; ``path`` is where rank 0 writes, named on the
    other ranks."""
    with RankAgreement(pg, "DeltaPublisher.publish", fault_timeout) as ranks:
        raise_failure()  # a compaction error, inside: the other ranks learn it
        start = time.perf_counter()
        taken = [(t, *t.table.change_log.take()) for t in tables]
        mine = {}
        try:
            for t, touched, removed in taken:
                mine[t.name] = capture.table(t, touched, removed)
            pieces = {
                t.name: (*column_slice(t, mine[t.name][0], capture.optim), mine[t.name][1])
                for t, _, _ in taken
            }
            everyone = gather_to_rank0(
                ranks, pg, {n: (meta, d, piece) for n, (meta, piece, d) in pieces.items()}
            )
            boundary = entries(d for _, d in mine.values())
            capture.give_back(mine)  # sent (rank 0's own: merged into new tensors below)
            mine = {}
            seconds = time.perf_counter() - start
            error = None
            if ranks.rank == 0:
                begin = time.perf_counter()
                try:  # slices that disagree fail as a write does: every rank learns it
                    merged = merge(everyone)
                    del everyone  # rank 0 holds the gathered deltas until written
                    path = write(merged)
                except Exception as e:  # posted to every rank, then raised
                    error = e
            outcome = ranks.post("written", outcome_of(error), root=0)[0]
            if error is not None:
                raise error
            raise_outcome(outcome, ranks.world_size)
        except BaseException:
            capture.give_back(mine)
            restore((taken, {}))
            raise
    if ranks.rank == 0:
        size = sum(delta_bytes(d) for _, d in merged.values())
        return DeltaCommit(version, path, size, seconds, time.perf_counter() - begin, 0, boundary)
    return DeltaCommit(version, path, 0, seconds, 0.0, 0, boundary)
