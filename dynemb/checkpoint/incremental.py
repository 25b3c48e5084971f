"""Incremental dump: the entries of a model's dynamic tables touched since a score reference.

Names and shapes mirror NVIDIA DynamicEmb's ``dynamicemb.incremental_dump`` (which
``dynemb.incremental_dump`` re-exports)::

    before = get_score(model)                  # {collection path: {table: int}}
    ...train...
    dumped, now = incremental_dump(model, before)
    # dumped[collection path][table] = (keys, rows); with_scores=True adds the scores
    # ``now`` is the reference of the next incremental dump

A collection path is ``"model"`` for the model itself (a DMP-wrapped collection, or
a bare BatchedDynamicEmbeddingTables) and ``"model.<module path>"`` for a sharded
collection inside it (DMP / DDP wrapper levels left out), as in DynamicEmb.

The score reference of a table is the lowest score an entry updated from now on
can get, so ``incremental_dump(model, get_score(model))`` returns exactly the
entries updated in between:

- TIMESTAMP and (TIMESTAMP, LFU): the table clock now (ns, ``time.monotonic_ns``);
  the compound is filtered by its last-access time, not by its LFU count.
- STEP: the step the next batch will get (``table.score_step + 1``).
- CUSTOMIZED: the score given by ``set_score``; before any, the maximum score stored.
- LFU: the maximum count stored (a count has no time: the threshold filters by count).
- DECAYED_LFU: the score one access of the next batch gets,
  ``(table.score_step + 1) << 16`` (scores count steps in units of 2**-16). Every entry
  touched from then on scores at least that, so it is dumped; so is an entry not
  touched whose decayed count, as of that step, is still at least one access (its
  score says so, its time of access is not kept). ``(TIMESTAMP, DECAYED_LFU)`` is
  filtered by its last-access time, exactly, as ``(TIMESTAMP, LFU)`` is.
- NO_EVICTION: no score is kept (every score is 0); 0 is returned and every entry
  is always dumped.

References are per rank (clocks and step counters are): pass ``get_score``'s result
back on the rank that produced it.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from torch import nn

from dynemb import _ops
from dynemb.config.types import DynamicEmbScoreStrategy
from dynemb.distributed.collectives import all_gather
from dynemb.distributed.rank_faults import DEFAULT_TIMEOUT_S, RankAgreement
from dynemb.table.batch_arguments import TIMESTAMP_CODES
from dynemb.table.scored_hash_table import ScoredHashTable
from dynemb.table_groups import public_collection_path, table_groups

if TYPE_CHECKING:  # annotations only: groups are found by protocol, not class
    from dynemb.tbe.batched_dynamic_embedding_tables import BatchedDynamicEmbeddingTables

ScoreDict = dict[str, dict[str, int]]
Dumped = dict[str, dict[str, tuple[torch.Tensor, ...]]]


_CHUNK_SLOTS = 1 << 16  # slots scanned at once: bounds the temporary memory of a dump
_TIMESTAMP = DynamicEmbScoreStrategy.TIMESTAMP.value
_STEP = DynamicEmbScoreStrategy.STEP.value
_CUSTOMIZED = DynamicEmbScoreStrategy.CUSTOMIZED.value
_NO_EVICTION = DynamicEmbScoreStrategy.NO_EVICTION.value


def get_score(model: nn.Module) -> ScoreDict | None:
    """The current score reference of every dynamic table of this rank.

    Args:
        model: a (DMP-)sharded model with dynamic tables, or any module holding
            BatchedDynamicEmbeddingTables (a bare one is the collection ``"model"``).

    Returns:
        ``{collection path: {table name: int}}`` (paths ``"model"``,
        ``"model.<module path>"``), or ``None`` (with a ``UserWarning``) when ``model``
        has no dynamic table. See the module docstring for what the int is under each
        score strategy.

    Example::

        >>> before = get_score(model)   # {"model.ebc": {"t0": 81234567890123, "t1": ...}}
    """
    collections = _collections(model)
    if not collections:
        warnings.warn("get_score: the model has no dynamic embedding table", stacklevel=2)
        return None
    return {
        name: {t: _reference(table) for t, table in tables.items()}
        for name, tables in collections.items()
    }


def set_score(model: nn.Module, table_score: int | Mapping[str, Mapping[str, int]]) -> None:
    """Sets the score that keys of CUSTOMIZED tables get when updated from now on.

    Training lookups give every key they touch this score (0 before the first
    ``set_score``); it is also the reference ``get_score`` returns for the table.

    Args:
        model: as in ``get_score``.
        table_score: one int for every dynamic table, or ``{collection: {table name:
            score}}`` with the collection named by its path (``"model.ebc"``) or, as in
            DynamicEmb, by its last attribute name (``"ebc"``; ``"model"`` for the
            model itself); scores are ints in [0, 2**63 - 1]; tables not named keep
            their score.

    Raises:
        ValueError: an unknown collection or table name, a table whose strategy is not
            CUSTOMIZED, or a score outside [0, 2**63 - 1] (nothing is changed then).
        TypeError: a score that is not an int.

    Warns:
        UserWarning: a score lower than the table's current reference (entries
            updated from now on rank below older ones and are missed by an incremental
            dump from the older reference).
    """
    collections = _collections(model)
    if isinstance(table_score, Mapping):
        entries = _named_entries(collections, _by_path(collections, table_score), "table_score")
    else:
        _check_int("table_score", table_score)
        entries = _every_table(collections, table_score)
    chosen = []
    for coll, name, table, score in entries:
        if table.strategy_code != _CUSTOMIZED:
            raise ValueError(
                f"set_score: table {coll!r}/{name!r} uses "
                f"{table.score_strategy}; only CUSTOMIZED tables take a score"
            )
        if not 0 <= score <= _ops.MAX_SCORE:
            raise ValueError(
                f"set_score: the score of table {coll!r}/{name!r} must be "
                f">= 0 and <= {_ops.MAX_SCORE} (an int64 score), got {score}"
            )
        chosen.append((coll, name, table, score))
    for coll, name, table, score in chosen:
        old = _reference(table)
        if score < old:
            warnings.warn(
                f"set_score: table {coll!r}/{name!r} score goes down from {old} to {score}",
                stacklevel=2,
            )
        table.custom_score = score


def incremental_dump(
    model: nn.Module,
    score_threshold: int | Mapping[str, Mapping[str, int]],
    pg: dist.ProcessGroup | None = None,
    *,
    with_scores: bool = False,
    fault_timeout: float = DEFAULT_TIMEOUT_S,
) -> tuple[Dumped, ScoreDict] | None:
    """The entries whose score is >= the threshold, on the host.

    With ``pg`` it is a collective over ``pg``: every rank of ``pg`` must call it, and
    every rank receives every rank's entries. Without, each rank gets its own entries.

    Args:
        model: as in ``get_score``.
        score_threshold: one int for every table, or ``{collection path: {table: int}}``
            (e.g. an earlier ``get_score`` result); tables not named are not dumped.
        pg: the process group to gather over (``None``: this rank's entries only).
        with_scores: (dynemb) also return each entry's score.
        fault_timeout: (dynemb; with ``pg``) seconds after which a rank that stopped
            responding counts as dead: the others raise RankFailure naming it (as in
            DynamicEmbDump); a rank that raises is reported to the others at once.

    Returns:
        ``None`` (with a ``UserWarning``) when ``model`` has no dynamic table; else
        ``(dumped, current_scores)``: ``dumped[collection][table] = (keys, rows)``, or
        ``(keys, rows, scores)`` with ``with_scores``: (m,) int64, (m, dim) in the
        table's value dtype (embedding columns, no optimizer state), (m,) int64 (the
        compound's last-access times), CPU tensors, concatenated in rank order (with
        ``pg``, a column-wise table's slices are joined: whole rows by ascending key,
        the scores of its first slice);
        ``current_scores`` is this rank's ``get_score(model)`` read before the dump
        (the reference of the next one).

    Raises:
        ValueError / TypeError: an unknown collection or table name, or a threshold
            that is not an int (raised before any collective).
        RankFailure (a RuntimeError): with ``pg``, another rank failed or died.
        RuntimeError: with ``pg``, the column slices of a table dumped different keys
            (they cannot: each slice stores the same keys, see dynemb.shard.cw_sharding).

    Example::

        >>> before = get_score(model)
        >>> ...train...
        >>> dumped, before = incremental_dump(model, before)
        >>> keys, rows = dumped["model.ebc"]["t0"]
    """
    collections = _collections(model)
    if not collections:
        warnings.warn("incremental_dump: the model has no dynamic embedding table", stacklevel=2)
        return None
    if isinstance(score_threshold, Mapping):
        chosen = list(_named_entries(collections, score_threshold, "score_threshold"))
    else:
        _check_int("score_threshold", score_threshold)
        chosen = list(_every_table(collections, score_threshold))
    with RankAgreement(pg, "incremental_dump", fault_timeout):
        current = get_score(model)
        local: Dumped = {}
        for coll, name, table, threshold in chosen:
            entry = _dump_table(table, threshold)
            local.setdefault(coll, {})[name] = entry if with_scores else entry[:2]
        if pg is None or dist.get_world_size(pg) == 1:
            return local, current
        return _concat_ranks(all_gather((local, _column_offsets(model)), pg)), current


# ------------------------------------------------------------------ internals


def _collections(model: nn.Module) -> dict[str, dict[str, ScoredHashTable]]:
    """This rank's dynamic tables: ``{collection path: {table name: table}}``."""
    found: dict[str, dict[str, ScoredHashTable]] = {}
    for path, group in _groups(model):
        # Caching mode: the slow tier, after the cache wrote its rows back.
        tables = [t.persistent_table() for t in group.tables]
        found.setdefault(path, {}).update(zip(group.table_names, tables))
    return found


def _column_offsets(model: nn.Module) -> dict[str, dict[str, int]]:
    """This rank's column slices: ``{collection path: {table name: first column}}``."""
    found: dict[str, dict[str, int]] = {}
    for path, group in _groups(model):
        if group.full_dims is None:
            continue
        for name, dim, full, options in zip(
            group.table_names, group.dims, group.full_dims, group.table_options
        ):
            if dim != full:
                found.setdefault(path, {})[name] = options.column_offset
    return found


def _groups(model: nn.Module) -> Iterator[tuple[str, BatchedDynamicEmbeddingTables]]:
    """``(collection path, group)`` of every group of dynamic tables of this rank."""
    for path, group in table_groups(model):
        yield public_collection_path(path), group


def _by_path(collections, named: Mapping) -> dict:
    """``named`` with collections given by their last attribute name re-keyed by path."""
    out = {}
    for coll, scores in named.items():
        if coll not in collections:
            paths = [p for p in collections if p.rsplit(".", 1)[-1] == coll]
            if len(paths) > 1:
                raise ValueError(
                    f"collection name {coll!r} is ambiguous: it names {paths}; use the path"
                )
            coll = paths[0] if paths else coll
        out[coll] = scores
    return out


def _every_table(collections, score: int) -> Iterator:
    for coll, tables in collections.items():
        for name, table in tables.items():
            yield coll, name, table, score


def _named_entries(collections, named: Mapping, arg: str) -> Iterator:
    """(collection, table name, table, int) of a nested ``{collection: {table: int}}``, checked."""
    for coll, scores in named.items():
        if coll not in collections:
            raise ValueError(
                f"{arg}: unknown collection {coll!r}; this model has {sorted(collections)}"
            )
        if not isinstance(scores, Mapping):
            raise TypeError(f"{arg}[{coll!r}] must be a dict of table name -> int, got {scores!r}")
        for name, score in scores.items():
            if name not in collections[coll]:
                raise ValueError(
                    f"{arg}: unknown table {name!r} in collection {coll!r}; it has "
                    f"{sorted(collections[coll])}"
                )
            _check_int(f"{arg}[{coll!r}][{name!r}]", score)
            yield coll, name, collections[coll][name], score


def _check_int(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {value!r}")


def _reference(table: ScoredHashTable) -> int:
    """The lowest score an entry updated from now on can get (see the module docstring)."""
    code = table.strategy_code
    if code == _ops.DECAYED_LFU:  # one access of the next batch (core/decay.h)
        return (table.score_step + 1) << _ops.DECAY_FRACTION_BITS
    if _ops.BATCH_VALUE_SOURCES[code] in ("clock", "step"):  # the next batch's value
        return _ops.batch_value(code, table.score_step + 1, table.now)
    if code == _NO_EVICTION:
        return 0
    if code == _CUSTOMIZED and table.custom_score is not None:
        return table.custom_score
    return _max_score(table)


def _max_score(table: ScoredHashTable) -> int:
    best = 0
    with table.lock.read():
        s = table.buffers
        for begin in range(0, s.num_slots, _CHUNK_SLOTS):
            slots = s.occupied(begin, min(s.num_slots, begin + _CHUNK_SLOTS))
            if slots.numel():
                best = max(best, int(s.scores[slots].max()))
    return best


def _dump_table(table: ScoredHashTable, threshold: int):
    """(keys, rows, scores) of the entries scoring >= threshold, on the host.

    The table's read lock is held for the whole scan: the dump is one snapshot."""
    keys, rows, scores = [], [], []
    with table.lock.read():
        s = table.buffers
        by_time = table.strategy_code in TIMESTAMP_CODES
        for begin in range(0, s.num_slots, _CHUNK_SLOTS):
            slots = s.occupied(begin, min(s.num_slots, begin + _CHUNK_SLOTS))
            if table.strategy_code == _NO_EVICTION:
                score = torch.zeros_like(slots)
            else:
                score = (s.timestamps if by_time else s.scores)[slots]
                keep = score >= threshold
                slots, score = slots[keep], score[keep]
            keys.append(s.keys[slots].cpu())
            rows.append(s.rows(slots, table.dim).cpu())
            scores.append(score.cpu())
    if not keys:  # a table always has slots; kept for an empty storage
        return (
            torch.empty(0, dtype=torch.int64),
            torch.empty((0, table.dim), dtype=table.value_dtype),
            torch.empty(0, dtype=torch.int64),
        )
    return torch.cat(keys), torch.cat(rows), torch.cat(scores)


def _concat_ranks(parts: list[tuple[Dumped, dict]]) -> Dumped:
    """The ranks' ``(dumped, column offsets)`` as one: a table's entries concatenated
    in rank order, or its column slices joined."""
    merged: dict[str, dict[str, list]] = {}
    for part, offsets in parts:
        for coll, tables in part.items():
            for name, entry in tables.items():
                offset = offsets.get(coll, {}).get(name)
                merged.setdefault(coll, {}).setdefault(name, []).append((offset, entry))
    return {
        coll: {
            name: _join_slices(coll, name, entries)
            if entries[0][0] is not None
            else tuple(torch.cat(list(col)) for col in zip(*(e for _, e in entries)))
            for name, entries in tables.items()
        }
        for coll, tables in merged.items()
    }


def _join_slices(coll: str, name: str, slices: list) -> tuple:
    """Whole rows of a column-wise table's ``(first column, (keys, rows, ...))`` slices,
    by ascending key; the other fields (scores) are the first slice's."""
    ordered = []
    for _, entry in sorted(slices, key=lambda s: s[0]):
        order = torch.argsort(entry[0])
        ordered.append([field[order] for field in entry])
    keys = ordered[0][0]
    if any(not torch.equal(o[0], keys) for o in ordered[1:]):
        raise RuntimeError(
            f"incremental_dump: the column slices of table {name!r} of {coll!r} hold "
            "different keys above the threshold"
        )
    rows = torch.cat([o[1] for o in ordered], dim=1)
    return (keys, rows, *ordered[0][2:])


__all__ = ["get_score", "incremental_dump", "set_score"]
