"""The slot-level work of a ScoredHashTable that the table's methods hand over with its
TableState (table_state.py): the entries of many keys for a delta's capture, a
cache's write-back upsert, and in-place snapshots. Each function reads and changes
the state it is given, through the helpers of growth.py.
"""

import dataclasses

import torch

from dynemb import _ops
from dynemb._host_reads import read_to_host
from dynemb.table.growth import upsert
from dynemb.table.table_state import TableState

# stored_entries de-duplicates n slots by a mark per slot when n * MARK_RATIO >= the
# table's slots, else by a sort: a small delta of a large table scans no table.
MARK_RATIO = 8


@dataclasses.dataclass(frozen=True)
class TableSnapshot:
    """A copy of a table's buffers and counters (``ScoredHashTable.snapshot``);
    ``owner`` is the token of the table it was taken from (only that table takes it
    back)."""

    generation: int
    buffers: list
    size: int
    step: int
    owner: object = None


def stored_entries(state: TableState, keys: torch.Tensor, out) -> tuple:
    """``ScoredHashTable.stored_entries`` over ``state``."""
    with state.lock.read():
        s = state.storage
        slots = _ops.table_find_slots(s.tensors(), keys)
        found = slots >= 0
        # Every key stored (the common case): two masked selects saved (111 -> 99 ms).
        if read_to_host(found.all(), "all found").item():
            missing = keys[:0]
        else:
            missing, slots = keys[~found], slots[found]
        slots = _distinct_ascending(slots, s.num_slots)
        m, width = slots.numel(), state.layout.row_width
        host = state.layout.device.type == "cpu"
        stored = torch.index_select(s.keys, 0, slots)
        rows = s.rows(slots, width, out=out("rows", m, width, s.values.dtype) if host else None)
        scores = out("scores", m, 0, torch.int64) if host else None
        if state.layout.keeps_scores:
            scores = torch.index_select(s.scores, 0, slots, out=scores)
        else:
            scores = torch.zeros_like(slots) if scores is None else scores.zero_()
    return stored, rows, scores, missing


def write_back_upsert(
    state: TableState, keys, rows, scores, timestamps, defer: bool
) -> tuple[torch.Tensor, tuple]:
    """The upsert of ``ScoredHashTable.write_back``: stores whole rows with exactly
    these scores, not counting a step; returns its status and the evicted buffers."""
    n, width = keys.numel(), state.layout.row_width
    rows = rows.contiguous()
    saved_scores = scores.contiguous() if state.layout.keeps_scores else None
    saved_times = None
    if timestamps is not None and state.layout.keeps_timestamps:
        saved_times = timestamps.contiguous()
    evicted = state.evicted_buffers(n)

    def op(table, policy, init, k, _scores, _values, ev, per_key):
        # One pass: whole rows (policy dim = row width) and their scores exactly as
        # given; per_key: the positions (re)tried.
        part = per_key.numel() != n
        r = rows[per_key] if part else rows
        sc = saved_scores[per_key] if part and saved_scores is not None else saved_scores
        ts = saved_times[per_key] if part and saved_times is not None else saved_times
        policy = policy._replace(dim=width)
        return _ops.table_restore(table, policy, init, k, r, None, sc, ts, ev)

    step = state.step  # a write-back is not a training step (STEP scores count those)
    positions = torch.arange(n, device=state.layout.device)
    status = upsert(
        state, op, keys, None, positions, evicted, return_status=True,
        per_key=positions, defer=defer,
    )  # fmt: skip
    state.step = step
    return status, evicted


def snapshot(state: TableState) -> TableSnapshot:
    """``ScoredHashTable.snapshot`` of ``state``."""
    with state.lock.read():
        buffers = [b.clone() for b in state.storage.tensors()]
        return TableSnapshot(state.generation, buffers, state.size, state.step, state.token)


def rollback(state: TableState, snapshot: TableSnapshot) -> None:
    """``ScoredHashTable.rollback`` of ``state`` (see its Raises)."""
    if not isinstance(snapshot, TableSnapshot):
        raise TypeError(
            f"rollback: `snapshot` must be a TableSnapshot of this table's snapshot(), "
            f"got {type(snapshot).__name__}"
        )
    if snapshot.owner is not state.token:
        raise ValueError(
            "rollback: `snapshot` was taken from another table; a table rolls back "
            "only to its own snapshot()"
        )
    with state.lock.write():
        if snapshot.generation != state.generation:
            raise ValueError(
                f"rollback: the table grew since the snapshot (storage generation "
                f"{snapshot.generation} -> {state.generation}); take a new snapshot"
            )
        log = state.change_log
        if log is not None:  # any key may come back or go: all of them, both ways
            log.removed(state.stored_keys())
        for dst, src in zip(state.storage.tensors(), snapshot.buffers, strict=True):
            dst.copy_(src)
        if log is not None:
            log.touched(state.stored_keys())
        state.size, state.step = snapshot.size, snapshot.step
        state.mutations += 1


def _distinct_ascending(slots: torch.Tensor, num_slots: int) -> torch.Tensor:
    """The distinct values of ``slots`` (valid slots, repeats allowed), ascending: by a
    mark per slot when they are many (linear in the table's slots), else by a sort
    (linear-log in their number, no pass over the table). The same result either way."""
    if slots.numel() * MARK_RATIO < num_slots:
        return torch.unique(slots)
    marked = torch.zeros(num_slots, dtype=torch.bool, device=slots.device)
    marked[slots] = True
    return torch.nonzero(marked, as_tuple=True)[0]
