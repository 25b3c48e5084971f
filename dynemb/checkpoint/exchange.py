"""What every checkpoint load does once its rows are read: send each saved key to the rank
that owns it under the model's current routing, and restore it there exactly."""

import contextlib

import torch
import torch.distributed as dist

from dynemb.checkpoint.collectives import admission_counter
from dynemb.checkpoint.tables import NamedTable
from dynemb.rank_faults import collective
from dynemb.shard.routing import route_keys

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


def route_rows(
    t: NamedTable, fields: dict, local: dict | None, pg, world_size: int, owner=None
) -> dict:
    """Sends each key of ``local`` (and its fields) to the rank that owns it now.

    Args:
        t: the table (its routing decides the owners).
        fields: field -> ``(dtype, width)`` (width 0: a 1-D field); ``keys`` among them.
        local: field -> (m,) or (m, width) tensor, or None for nothing to send.
        pg, world_size: the group every rank of which calls this.
        owner: (m,) int64 destination of each row, instead of the table's routing.

    Returns:
        field -> the rows this rank received.
    """
    if local is None:
        local = {f: torch.empty((0, w) if w else (0,), dtype=d) for f, (d, w) in fields.items()}
        owner = None
    if world_size == 1:
        return local
    if owner is None:
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


def restore_rows(t: NamedTable, fields: dict, rows: dict) -> int:
    """Stores the received entries exactly (rows, state, scores, timestamps) in one
    pass of the table op; returns the keys that failed."""
    table = t.table
    keys = rows["keys"]
    if keys.numel() == 0:
        return 0
    stats = table.restore(
        keys,
        rows["values"],
        rows.get("state"),
        rows["scores"] if table.keeps_scores else None,
        rows.get("timestamps"),
    )
    return stats.failed


__all__ = [
    "RESTORE_THREADS",
    "op_threads",
    "prepare_tables",
    "restore_rows",
    "restored_step",
    "route_rows",
]
