"""Undo of a training lookup that ``DynamicEmbCheckMode.ERROR`` refuses.

A training lookup (``find_or_insert_slots``) stores the keys that fit and updates the
scores of the keys it finds; when some keys fail, ERROR mode must leave the table as
it was. ``record`` notes, before the lookup, which of its distinct keys are stored
and their scores, timestamps and the step; ``undo`` then erases the keys the lookup
inserted and puts the recorded scores, timestamps and step back (rows of found keys
are not changed by a lookup).

What cannot be undone, and is reported by ``undo``'s result: residents the
lookup evicted to make room (only a CUSTOMIZED table evicts and fails in one batch)
are lost, and a table that grew keeps its larger capacity. ``undo`` needs the
lookup to have been the table's only change since ``record``; otherwise it raises
ValueError instead of guessing.
"""

import dataclasses
from typing import TYPE_CHECKING

import torch

from dynemb.table.batch_stats import BatchStats

if TYPE_CHECKING:  # the table's methods call these functions
    from dynemb.table.scored_hash_table import ScoredHashTable


@dataclasses.dataclass
class LookupRecord:
    """What a lookup of ``keys`` may change, as it was before the lookup.

    Attributes:
        keys: (n,) int64 distinct keys of the lookup.
        found: (n,) bool, stored before it.
        scores: (n,) int64 their scores (None: the table keeps none).
        timestamps: (n,) int64 their timestamps (None: the table keeps none).
        step: the table's ``score_step``.
        mutations: the table's ``mutations`` (a lookup adds one).
        size: the table's ``size()``.
    """

    keys: torch.Tensor
    found: torch.Tensor
    scores: torch.Tensor | None
    timestamps: torch.Tensor | None
    step: int
    mutations: int
    size: int


def record(table: "ScoredHashTable", keys: torch.Tensor) -> LookupRecord:
    """Notes the state a lookup of distinct ``keys`` (n,) int64 may change."""
    return LookupRecord(
        keys=keys,
        found=table.find_slots(keys) >= 0,
        scores=table.get_scores(keys) if table.keeps_scores else None,
        timestamps=table.get_timestamps(keys) if table.keeps_timestamps else None,
        step=table.score_step,
        mutations=table.mutations,
        size=table.size(),
    )


def undo(
    table: "ScoredHashTable", before: LookupRecord, slots: torch.Tensor, stats: BatchStats
) -> int:
    """Undoes the lookup that gave ``slots`` (n,) and ``stats``; returns the number of
    residents it evicted, which are lost (the rest of the table is as before).

    Raises:
        ValueError: the table changed otherwise since ``record`` (nothing is undone).
    """
    if table.mutations != before.mutations + 1:
        raise ValueError(
            "cannot undo the failed lookup: the table changed concurrently "
            f"({table.mutations - before.mutations - 1} other changes); the keys it "
            "inserted are still stored"
        )
    inserted = before.keys[~before.found & (slots >= 0)]
    erased = table.erase(inserted) if inserted.numel() else 0
    found = before.found & (table.find_slots(before.keys) >= 0)
    at = torch.nonzero(found, as_tuple=True)[0]
    if at.numel():  # their scores and timestamps back, rows as they are
        keys = before.keys[at]
        rows, _, _ = table.find_entries(keys)
        dim = table.dim
        table.restore(
            keys,
            rows[:, :dim].contiguous(),
            rows[:, dim:].contiguous() if table.extra_columns else None,
            before.scores[at] if before.scores is not None else None,
            before.timestamps[at] if before.timestamps is not None else None,
        )
    table.score_step = before.step
    if table.size() != before.size - stats.evicted:
        raise ValueError(
            f"cannot undo the failed lookup exactly: the table holds {table.size()} keys, "
            f"{before.size} before it ({erased} inserted keys were erased again, "
            f"{stats.evicted} residents evicted)"
        )
    return stats.evicted


__all__ = ["LookupRecord", "record", "undo"]
