"""Saved entries out of and into a ScoredHashTable's TableState (table_state.py): the
work of ``export_batch`` (scans slots) and ``restore`` (stores entries exactly as
saved), for checkpoints and exports. The table's methods check the arguments and
hand them over with its state; these functions change it through growth.py.
"""

import torch

from dynemb import _ops
from dynemb.table import batch_arguments as args
from dynemb.table.batch_stats import BatchStats
from dynemb.table.growth import upsert
from dynemb.table.table_state import TableState


def export_batch(
    state: TableState, offset: int, n: int, include_extra: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """``ScoredHashTable.export_batch`` of ``state`` (see its docstring)."""
    args.check_int("n", n, 1)
    with state.lock.read():
        cap = state.storage.num_slots
        if not isinstance(offset, int) or not 0 <= offset <= cap:
            raise ValueError(f"offset must be an int in [0, capacity()={cap}], got {offset!r}")
        end = min(cap, offset + n)
        s = state.storage
        slots = s.occupied(offset, end)
        width = state.layout.row_width if include_extra else state.dim
        keys = s.keys[slots]
        values = s.rows(slots, width)
        scores = s.scores[slots] if state.layout.keeps_scores else torch.zeros_like(keys)
    return keys, values, scores, end


def restore(state: TableState, keys: torch.Tensor, saved: tuple) -> BatchStats:
    """Stores checked saved entries in one pass: distinct ``keys`` and ``saved`` =
    ``(values, state columns, scores, timestamps)``, the last three None or (n, ...)
    tensors (see ``ScoredHashTable.restore``)."""
    n = keys.numel()

    def op(table, policy, init, k, _scores, _rows, evicted, per_key):
        # per_key: positions in the batch (all of them, or the retried ones).
        sub = saved if per_key.numel() == n else [_subset(t, per_key) for t in saved]
        return _ops.UpsertResult(*_ops.table_restore(table, policy, init, k, *sub, evicted))

    positions = torch.arange(n, device=state.layout.device)
    # `positions` stands in for the row buffer too: op gathers its own inputs.
    # pins=False: the saved keys compete by score (the highest stay), keys of a
    # training batch in flight excepted.
    return upsert(state, op, keys, None, positions, evicted=None, per_key=positions, pins=False)


def _subset(t: torch.Tensor | None, positions: torch.Tensor) -> torch.Tensor | None:
    return None if t is None else t[positions].contiguous()
