"""The collective parts of a DeltaPublisher over several processes (row-wise sharding).

Each rank holds a shard of every dynamic table, and a key is routed to exactly one
rank (dynemb/shard/routing.py): the ranks' changes to a table are disjoint, so the
delta of the model is the concatenation of the ranks' deltas. Rank 0 gathers them
and writes the one delta (the on-disk format does not depend on the world size);
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
from dynemb.deltas.format import TableDelta
from dynemb.distributed.rank_faults import RankAgreement, RankFailure


def agree_on_tables(ranks: RankAgreement, pg, local_error: str | None, tables: dict) -> None:
    """Every rank's check of its own tables, and their ``{name: meta}``, gathered: the
    same ValueError on every rank if one rank's check failed or the tables differ."""
    everyone = [None] * ranks.world_size
    ranks.collective(dist.all_gather_object, everyone, (local_error, tables), pg)
    for r, (error, _) in enumerate(everyone):
        if error is not None:
            raise ValueError(error if r == ranks.rank else f"rank {r}: {error}")
    for r, (_, theirs) in enumerate(everyone):
        if theirs != everyone[0][1]:
            raise ValueError(
                f"DeltaPublisher: rank {r} holds dynamic tables {theirs}, rank 0 "
                f"{everyone[0][1]}; every rank must hold a shard of the same tables"
            )


def gather_to_rank0(ranks: RankAgreement, pg, tables: dict) -> list | None:
    """Every rank's ``{name: (meta, TableDelta)}``, in rank order, on rank 0 (None on
    the others). Column views are made contiguous first: pickling a view would send
    its whole storage (the optimizer state columns too)."""
    mine = {name: (meta, _contiguous(d)) for name, (meta, d) in tables.items()}
    out = [None] * ranks.world_size if ranks.rank == 0 else None
    ranks.collective(dist.gather_object, mine, out, 0, pg)
    return out


def merge(everyone: list) -> dict:
    """Rank 0: one ``{name: (meta, TableDelta)}`` of the ranks' deltas (concatenated)."""
    merged = {}
    for name, (meta, _) in everyone[0].items():
        parts = [r[name][1] for r in everyone]
        fields = {f: _cat([getattr(p, f) for p in parts]) for f in _FIELDS}
        merged[name] = (meta, TableDelta(**fields, score_strategy=parts[0].score_strategy))
    return merged


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


__all__ = ["agree_on_tables", "gather_to_rank0", "merge", "outcome_of", "raise_outcome"]


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
            everyone = gather_to_rank0(ranks, pg, mine)
            boundary = entries(d for _, d in mine.values())
            capture.give_back(mine)  # sent (rank 0's own: merged into new tensors below)
            mine = {}
            seconds = time.perf_counter() - start
            error = None
            if ranks.rank == 0:
                begin = time.perf_counter()
                merged = merge(everyone)
                del everyone  # rank 0 holds the gathered deltas until written
                try:
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
