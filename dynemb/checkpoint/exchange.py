"""What every checkpoint load does once its rows are read: send each saved key to the rank
that owns it under the model's current routing, and restore it there exactly."""

import contextlib
import dataclasses
import warnings

import torch
import torch.distributed as dist

from dynemb import _ops
from dynemb.checkpoint.tables import NamedTable, admission_counter
from dynemb.distributed.collectives import all_gather, rank_and_size
from dynemb.distributed.rank_faults import collective
from dynemb.distributed.routing import route_keys
from dynemb.dump_files.manifest import INT64_MAX

# Threads of the table ops while loading. One op thread restored 4M rows of 192
# floats in 0.5-0.8 s where two took 1.5-3.8 s (same runs, 2-core machine shared
# with other work: an OpenMP team with a static split waits for its slowest,
# preempted thread at every batch).
RESTORE_THREADS = 1


@contextlib.contextmanager
def op_threads(n: int):
    """Runs the block with ``n`` intra-op threads (torch's setting, restored after)."""
    before = torch.get_num_threads()
    torch.set_num_threads(min(n, before))
    try:
        yield
    finally:
        torch.set_num_threads(before)


def table_holders(tables: list[NamedTable], pg) -> dict[str, list[int]]:
    """Every dynamic table of the model on any rank of ``pg``: name -> the ranks holding
    it (all of them row-wise, one table-wise, a node's table-row-wise, one per slice
    column-wise). Every rank
    calls it."""
    holders: dict[str, list[int]] = {}
    for rank, names in enumerate(all_gather([t.name for t in tables], pg)):
        for name in names:
            holders.setdefault(name, []).append(rank)
    return holders


def sliced_tables(tables: list[NamedTable], pg) -> set[str]:
    """The tables held in column slices on any rank of ``pg``. Every rank calls it."""
    return {
        name for names in all_gather([t.name for t in tables if t.is_slice], pg) for name in names
    }


def check_row_wise_everywhere(tables: list[NamedTable], pg, what: str) -> None:
    """Raises ValueError on every rank naming every table ``what`` (DynamicEmb's file
    layout: whole rows, files per rank of a row-wise table) cannot hold: tables sharded
    column-wise (on any rank), and tables not held by every rank of ``pg`` (table-wise,
    table-row-wise). Every rank calls it."""
    world_size = rank_and_size(pg)[1]
    sliced = sliced_tables(tables, pg)
    holders = table_holders(tables, pg)
    partial = sorted(
        n for n, ranks in holders.items() if len(ranks) < world_size and n not in sliced
    )
    problems = []
    if sliced:
        problems.append(f"tables {sorted(sliced)} are sharded column-wise")
    if partial:
        problems.append(
            f"tables {partial} are sharded table-wise or table-row-wise (not on every rank)"
        )
    if problems:
        raise ValueError(
            f"{what}: {'; '.join(problems)}; DynamicEmb's layout holds whole rows of row-wise "
            "tables only: use format='dynemb'"
        )


def table_routes(tables: list[NamedTable], pg) -> dict[str, tuple[str, int]]:
    """Every dynamic table of the model on any rank of ``pg``: name -> how its keys are
    routed among the ranks holding it (``table_routing``), so that a rank not holding
    it can send it rows. Every rank calls it."""
    routes: dict[str, tuple[str, int]] = {}
    for rank_routes in all_gather({t.name: t.group.table_routing(t.index) for t in tables}, pg):
        routes.update(rank_routes)
    return routes


@dataclasses.dataclass(frozen=True)
class HeldBy:
    """The ranks holding a table that not every rank holds (table-wise: one;
    table-row-wise: the ranks of its node, in order) and its routing among them."""

    ranks: tuple[int, ...]
    dist_type: str
    num_embeddings: int

    def owners(self, keys: torch.Tensor) -> torch.Tensor:
        """(m,) int64: the rank of the group owning each of ``keys`` ((m,) int64)."""
        if len(self.ranks) == 1:  # held whole (table-wise, a column-wise table of one slice)
            return torch.full_like(keys, self.ranks[0])
        local, _ = route_keys(keys, self.dist_type, len(self.ranks), self.num_embeddings)
        return torch.tensor(self.ranks, dtype=torch.int64, device=keys.device)[local]


def held_by(ranks: list[int], world_size: int, routing: tuple[str, int]) -> HeldBy | None:
    """None when every rank holds a share of the table (row-wise: each rank's table
    routes), else the ranks holding it and ``routing`` (its ``table_routing``)."""
    if len(ranks) == world_size:
        return None
    return HeldBy(tuple(sorted(ranks)), *routing)


def route_rows(
    t: NamedTable | None,
    fields: dict,
    local: dict | None,
    pg,
    world_size: int,
    owner=None,
    holders: HeldBy | None = None,
    replicas: list[int] | None = None,
) -> dict:
    """Sends each key of ``local`` (and its fields) to the rank that owns it now.

    Args:
        t: the table (its routing decides the owners); None on a rank that does not
            hold it (then ``holders`` are the ranks that do).
        fields: field -> ``(dtype, width)`` (width 0: a 1-D field); ``keys`` among them.
        local: field -> (m,) or (m, width) tensor, or None for nothing to send.
        pg, world_size: the group every rank of which calls this.
        owner: (m,) int64 destination of each row, instead of the table's routing.
        holders: the ranks holding the table when not every rank does (table-wise,
            table-row-wise): each row goes to its owner among them.
        replicas: the ranks holding a column slice of the table: every row goes to each.

    Returns:
        field -> the rows this rank received.
    """
    if local is None:
        local = {f: torch.empty((0, w) if w else (0,), dtype=d) for f, (d, w) in fields.items()}
        owner = None
    if world_size == 1:
        return local
    if replicas is not None:
        m = local["keys"].numel()
        local = {f: v.repeat((len(replicas),) + (1,) * (v.dim() - 1)) for f, v in local.items()}
        owner = torch.tensor(replicas, dtype=torch.int64).repeat_interleave(m)
    elif holders is not None:
        owner = holders.owners(local["keys"])
    elif owner is None:
        dist_type, num_embeddings = t.group.table_routing(t.index)
        owner, _ = route_keys(local["keys"], dist_type, world_size, num_embeddings)
    return collective(_exchange, fields, local, owner, pg, world_size)


def _exchange(fields: dict, local: dict, owner, pg, world_size: int) -> dict:
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


def prepare_tables(t: NamedTable, merge: bool, counter: bool) -> None:
    """Before a load writes into ``t`` (every check passed): a cached table empties its
    cache into its slow tier; without ``merge`` the table (and, with ``counter``, its
    admission counts) is emptied, so that the load restores the checkpoint exactly."""
    t.prepare_load()
    if merge:
        return
    t.table.clear()
    counts = admission_counter(t) if counter else None
    if counts is not None:
        keys, _ = counts.dump()
        if keys.numel():
            counts.erase(keys)


def restored_step(current: int, saved: int, merge: bool) -> int:
    """A step after a load: the saved one, or with ``merge`` the larger of the two."""
    return max(current, saved) if merge else saved


@dataclasses.dataclass(frozen=True)
class StepLimits:
    """The largest steps a load may restore into a table and still train it: each counter
    goes one step further at the next batch, which the ops take as an int64 (a DECAYED_LFU
    table's scores only up to the core's MAX_DECAY_STEP, csrc/core/decay.h).

    Attributes:
        score: the largest ``table.score_step``.
        optimizer: the largest optimizer step (the module's ``step``, Adam's count).
        score_rule: why ``score`` is the largest, for messages.
    """

    score: int
    optimizer: int
    score_rule: str

    @staticmethod
    def of(t: NamedTable) -> "StepLimits":
        """The limits of table ``t`` under its score strategy."""
        if t.table.score_half_life_steps is not None:  # DECAYED_LFU, alone or compound
            rule = (
                f"table {t.name!r} scores by DECAYED_LFU, whose next step must not pass "
                f"{_ops.MAX_DECAY_STEP}, the core's largest decay step"
            )
            return StepLimits(_ops.MAX_DECAY_STEP - 1, INT64_MAX - 1, rule)
        return StepLimits(INT64_MAX - 1, INT64_MAX - 1, "the next step must fit an int64")


def restore_rows(t: NamedTable, fields: dict, rows: dict) -> int:
    """Stores the received entries exactly (rows, state, scores, timestamps) in one
    pass of the table op; returns the rows it dropped: saved keys that failed, and,
    in an evicting table, entries evicted to make room (a saved row or, with
    ``merge``, a stored one).

    An evicting table that cannot hold them all (its size plus the entries exceeds its
    max capacity) gets them in ascending (score, digest, key) order: a full bucket
    evicts its lowest (score, digest, key) resident, so of the entries one call brings,
    each bucket keeps the highest. Otherwise they go in as received, so that a table
    loaded from its own dump lays its slots out as before.
    """
    table = t.table
    keys = rows["keys"]
    if keys.numel() == 0:
        return 0
    if table.keeps_scores and table.size() + keys.numel() > table.max_capacity():
        rows = {f: v[_ascending(keys, rows["scores"])] for f, v in rows.items()}
        keys = rows["keys"]
    stats = table.restore(
        keys,
        rows["values"],
        rows.get("state"),
        rows["scores"] if table.keeps_scores else None,
        rows.get("timestamps"),
    )
    return stats.failed + stats.evicted


def _ascending(keys: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
    """(n,) int64 positions that sort the entries by (score, digest, key), the order
    in which a bucket chooses its victim (lowest first)."""
    digests = _ops.hash_keys(keys, 1)[1]
    order = torch.argsort(keys, stable=True)
    order = order[torch.argsort(digests[order], stable=True)]
    return order[torch.argsort(scores[order], stable=True)]


class CheckpointWarning(UserWarning):
    """A load that dropped saved rows of an evicting table (they did not fit)."""


class RowsDroppedError(RuntimeError):
    """A load that dropped saved rows: a NO_EVICTION table's, or (``strict``) an
    evicting table's. The other rows were loaded."""


def report_dropped(dropped: dict, tables: list[NamedTable], strict: bool, pg) -> None:
    """After a load (every rank calls it): the rows each table dropped, summed over the
    ranks. A NO_EVICTION table that dropped any raises; an evicting table warns
    (CheckpointWarning), or raises with ``strict``.

    Args:
        dropped: table name -> rows this rank dropped (restore_rows' counts).
        tables: the loaded tables.
        strict: raise for evicting tables too.
        pg: the process group of the load.

    Raises:
        RowsDroppedError (a RuntimeError): naming each table and its count (after every
            row was loaded).
    """
    totals: dict[str, int] = {}
    evicting: set[str] = set()  # of every rank: a table-wise table is on one
    mine = {t.name for t in tables if t.table.keeps_scores}
    for rank_dropped, rank_evicting in all_gather((dropped, mine), pg):
        evicting |= rank_evicting
        for name, n in rank_dropped.items():
            totals[name] = totals.get(name, 0) + n
    failed = {name: n for name, n in totals.items() if n and name not in evicting}
    if failed:
        raise RowsDroppedError(
            f"DynamicEmbLoad: keys did not fit in their tables (capacity): {failed}"
        )
    evicted = {name: n for name, n in totals.items() if n and name in evicting}
    if not evicted:
        return
    message = (
        f"DynamicEmbLoad: rows did not fit in evicting tables and were dropped "
        f"(table: rows): {evicted}; a full bucket evicts its lowest (score, digest, key) "
        "entry (see DynamicEmbLoad for which rows stay)"
    )
    if strict:
        raise RowsDroppedError(message + " (strict=True)")
    warnings.warn(message + "; pass strict=True to make this an error", CheckpointWarning, 3)


__all__ = [
    "RESTORE_THREADS",
    "CheckpointWarning",
    "RowsDroppedError",
    "op_threads",
    "prepare_tables",
    "report_dropped",
    "restore_rows",
    "restored_step",
    "StepLimits",
    "check_row_wise_everywhere",
    "route_rows",
    "HeldBy",
    "held_by",
    "sliced_tables",
    "table_holders",
    "table_routes",
]
