"""``Capture``: a DeltaPublisher's reads of its tables into host buffers of its own.

At a batch boundary the keys each table's change log recorded are read (their rows,
scores, optimizer state and timestamps, or tombstones: ``precapture.read_entries``),
every table in parallel: the reads are memory-bound and release the GIL (W-train, 2
cores: 0.5 s a delta on one thread). The rows and scores go into buffers reused from
one delta to the next (dynemb/deltas/buffers.py), which the writer thread makes ready
between deltas (``reserve``). The helpers below put taken keys back in their logs
when a delta is not committed: no change is lost.
"""

import os
from concurrent.futures import ThreadPoolExecutor

import torch

from dynemb.config.score_strategies import score_strategy_label
from dynemb.deltas.buffers import CaptureBuffers
from dynemb.deltas.format import TableDelta, table_delta_meta
from dynemb.deltas.precapture import read_entries
from dynemb.table.scored_hash_table import ScoredHashTable


class Capture:
    """Reads ``tables`` (``checkpoint.tables.named_tables``) into ``buffers``."""

    def __init__(self, tables: list, optim: bool, buffers: CaptureBuffers) -> None:
        self.tables = tables
        self.optim = optim
        self.buffers = buffers
        self._pool = ThreadPoolExecutor(
            max(1, min(len(tables), os.cpu_count() or 1)),
            thread_name_prefix="DeltaPublisher capture",
        )

    def at_boundary(self, inflight: dict, staged: dict) -> tuple[list, dict]:
        """Takes every table's log (as recorded: ``read_entries`` de-duplicates by slot)
        and reads its entries now, the tables in parallel; ``inflight``: by table name,
        the ``(touched, removed)`` of a generation the pre-capture was reading, read too.

        Returns ``(reads, fresh)``: the ``(t, touched, removed)`` taken, and by table
        name ``(meta, TableDelta)``. A table whose read fails raises after the others
        finished, and every key taken (the generations in ``staged`` too) goes back to
        its log."""

        def read(t):  # a table's keys and entries; on failure its keys go back
            touched, removed = _joined(t.table.change_log.take_recorded(), inflight.get(t.name))
            try:
                return (t, touched, removed), self.table(t, touched, removed)
            except BaseException:
                restore(([(t, touched, removed)], {}))
                raise

        futures = [self._pool.submit(read, t) for t in self.tables]
        reads, fresh, failure = [], {}, None
        for t, future in zip(self.tables, futures, strict=True):
            try:
                taken, fresh[t.name] = future.result()
                reads.append(taken)
            except BaseException as e:  # the first is raised below
                failure = failure or e
        if failure is not None:
            self.give_back(fresh)
            restore((reads, staged))
            raise failure
        return reads, fresh

    def table(self, t, touched: torch.Tensor, removed: torch.Tensor) -> tuple:
        """``(meta, TableDelta)`` of one table now, its rows and scores in buffers
        (``give_back`` returns them once the delta is written). Column slices stay
        views of the gathered rows: the writer makes them contiguous, off the training
        thread."""
        table: ScoredHashTable = t.table
        delta = read_entries(table, touched, removed, self.optim, self.buffers.out(t.name))
        return table_meta(table, table.extra_columns if self.optim else 0), delta

    def reserve(self) -> None:
        """Makes each table's rows and scores buffers hold its keys touched so far (at
        most its stored keys), their pages touched on the calling thread (the
        writer's, between deltas): the capture at the boundary then allocates nothing,
        the first one too (W-train: 2.3 s into fresh buffers, 1.0 s into touched ones)."""
        for t in self.tables:
            log = t.table.change_log
            if log is None:
                continue
            table: ScoredHashTable = t.table
            rows = min(log.touched_bound(), table.size())
            if rows == 0:
                continue
            width = table.dim + table.extra_columns
            self.buffers.reserve(f"{t.name}.rows", rows, width, table.value_dtype)
            self.buffers.reserve(f"{t.name}.scores", rows, 0, torch.int64)

    def give_back(self, tables: dict) -> None:
        """Returns the buffers of a delta's ``{name: (meta, TableDelta)}`` (written,
        failed or gathered)."""
        for _, d in tables.values():
            self.buffers.give_delta(d)

    def close(self) -> None:
        self._pool.shutdown()
        self.buffers.clear()


def table_meta(table: ScoredHashTable, state_columns: int | None = None) -> dict:
    """The delta manifest's fields of ``table`` (``state_columns``: the table's own)."""
    if state_columns is None:
        state_columns = table.extra_columns
    return table_delta_meta(
        table.dim, table.value_dtype, state_columns, score_strategy_label(table)
    )


def restore(taken: tuple) -> None:
    """Puts taken keys back in their logs: a delta not committed goes into the next.
    ``taken``: ``(reads, staged)``, the ``(t, touched, removed)`` read at the boundary
    and the generations read before it by table name (their upserts and tombstones)."""
    reads, staged = taken
    for t, touched, removed in reads:
        log = t.table.change_log
        log.touched(touched)
        log.removed(removed)
        for d in staged.get(t.name, ()):
            log.touched(d.keys)
            log.removed(d.tombstones)


def entries(deltas) -> int:
    """Upserts and tombstones of ``deltas`` (TableDelta)."""
    return sum(d.keys.numel() + d.tombstones.numel() for d in deltas)


def delta_bytes(d: TableDelta) -> int:
    parts = (d.keys, d.values, d.scores, d.state, d.timestamps, d.tombstones)
    return sum(p.numel() * p.element_size() for p in parts if p is not None)


def _joined(taken: tuple, more: tuple | None) -> tuple:
    """A log's ``(touched, removed)`` and those of a generation being read, if any
    (repeats kept)."""
    if more is None:
        return taken
    return tuple(torch.cat([a, b]) for a, b in zip(taken, more, strict=True))


__all__ = ["Capture", "delta_bytes", "entries", "restore", "table_meta"]
