"""Pre-capture: a publisher's writer thread copies most of the next delta's rows while
training goes on, so that the batch boundary reads only the keys of the last steps.

Why: on W-train a delta every 100 steps touches 4.4M keys (1.1 GB of rows), and
reading them all at the boundary stops training for about 0.5 s (bench_deltas.py).

How (the generations of dynemb/table/change_log.py): between deltas, the writer
thread asks each table's log to seal its keys so far; a log seals at its next record
(or training lookup's announcement) made while no training write is pending, so
every row of a sealed key then holds its value until the key is recorded again. The
thread copies the sealed keys' entries (row, score, timestamp, or a tombstone) in
chunks, each under the table's read lock
(a chunk never sees a batch op or a backward half done). A later generation, and the
boundary's own read of the keys recorded since the last seal, supersede an earlier
entry of the same key (``merge``, on the writer thread). Seals are spaced by the
previous interval between deltas (``SEAL_AT``): the bulk of the keys is copied once,
about halfway, and the boundary reads the few recorded after the last seal.
"""

import math
import threading
import time

import torch

from dynemb.deltas.format import TableDelta
from dynemb.table.scored_hash_table import ScoredHashTable

# When to seal, as fractions of the previous interval between two deltas; after the
# last, one every SEAL_AFTER intervals. Early seals copy keys that are often recorded
# again (hot keys: read twice); late ones leave more to the boundary.
SEAL_AT = (0.5, 0.8, 0.9, 0.95, 0.98, 1.0, 1.1, 1.25, 1.5, 1.75, 2.0)
SEAL_AFTER = 0.25
CHUNK_KEYS = 1 << 16  # keys read under one hold of a table's read lock


def _fresh(_field: str, rows: int, width: int, dtype: torch.dtype) -> torch.Tensor:
    """The default ``out``: a new host tensor ((rows,) when ``width`` is 0)."""
    return torch.empty((rows, width) if width else (rows,), dtype=dtype)


def read_entries(
    table: ScoredHashTable,
    touched: torch.Tensor,
    removed: torch.Tensor,
    optim: bool,
    out=None,
) -> TableDelta:
    """The entries of ``touched`` and ``removed`` (host keys, repeats allowed) in
    ``table`` now: an upsert (row, score, timestamp) for each key stored, a tombstone
    for each not stored, each key once (upserts in slot order: see
    ``ScoredHashTable.stored_entries``). Rows and scores go into ``out`` (None: fresh
    tensors); private host tensors (nothing of the table)."""
    device = table.device
    out = out or _fresh
    keys, rows, scores, missing = table.stored_entries(touched.to(device), out)
    keys, missing = keys.cpu(), missing.cpu()
    if rows.device.type != "cpu":  # a GPU table: its rows copied to the host
        rows = out("rows", *rows.shape, rows.dtype).copy_(rows)
        scores = out("scores", scores.numel(), 0, scores.dtype).copy_(scores)
    stored = (table.find_slots(removed.to(device)) >= 0).cpu()
    # A key touched and not stored any more left the table since: a tombstone too.
    tombstones = torch.cat([missing, removed[~stored]])
    return TableDelta(
        keys=keys,
        values=rows[:, : table.dim],
        scores=scores,  # zeros where the table keeps none
        state=rows[:, table.dim :] if optim else None,
        timestamps=table.get_timestamps(keys.to(device)).cpu() if table.keeps_timestamps else None,
        tombstones=tombstones.unique() if tombstones.numel() else tombstones,
    )


def merge(entries: list[TableDelta], out=None) -> TableDelta:
    """One delta of ``entries`` (oldest first): each key's latest entry (an upsert or
    a tombstone) and nothing of its earlier ones. The upserts are gathered into
    ``out(field, rows, width, dtype)`` (None: fresh tensors): a publisher's reused
    buffers, for a fresh output's page faults cost more than the gather."""
    if len(entries) == 1:
        return entries[0]
    out = out or _fresh
    parts = [p for e in entries for p in (e.keys, e.tombstones)]
    keys = torch.cat(parts)
    _, inverse = torch.unique(keys, return_inverse=True)
    position = torch.arange(keys.numel())
    latest = torch.full((int(inverse.max()) + 1 if keys.numel() else 0,), -1, dtype=torch.int64)
    latest.scatter_reduce_(0, inverse, position, "amax")
    survives = latest[inverse] == position
    kept, start = [], 0
    for p in parts:
        kept.append(torch.nonzero(survives[start : start + p.numel()], as_tuple=True)[0])
        start += p.numel()
    upserts = kept[0::2]
    total = sum(k.numel() for k in upserts)

    def gather(field):
        first = getattr(entries[0], field)
        if first is None:
            return None
        width = first.shape[1] if first.dim() == 2 else 0
        merged = out(f"merged.{field}", total, width, first.dtype)
        begin = 0
        for e, index in zip(entries, upserts, strict=True):
            end = begin + index.numel()
            torch.index_select(getattr(e, field), 0, index, out=merged[begin:end])
            begin = end
        return merged

    return TableDelta(
        keys=gather("keys"),
        values=gather("values"),
        scores=gather("scores"),
        state=gather("state"),
        timestamps=gather("timestamps"),
        tombstones=torch.cat([e.tombstones[k] for e, k in zip(entries, kept[1::2], strict=True)]),
    )


class PreCapture:
    """The generations read between deltas, per table (see the module). ``step`` runs
    on the writer thread; ``take`` on the training thread at a boundary."""

    def __init__(self, tables: list, optim: bool, take) -> None:
        self._tables = tables  # dynemb.checkpoint.tables entries: .name, .table
        self._optim = optim
        self._take = take  # (name, rows, width, dtype) -> a host buffer (CaptureBuffers)
        self.lock = threading.Lock()  # held while a chunk is read; ``take`` takes it
        # One ``step`` at a time: two would read two generations of a table at once and
        # could stage them out of order (the older entry of a key would win the merge).
        self._stepping = threading.Lock()
        self._staged: dict[str, list[TableDelta]] = {t.name: [] for t in tables}
        self._inflight: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        self._epoch = 0  # advanced by take: a read in flight across one is dropped
        self._started = time.monotonic()
        self._interval: float | None = None  # the previous interval between deltas
        self._seals = 0  # seals requested in this interval

    def start(self) -> None:
        """The chain starts (the base is written): no interval known yet (no seal
        before the first delta)."""
        with self.lock:
            self._started, self._interval, self._seals = time.monotonic(), None, 0

    def step(self) -> None:
        """Requests the next seal when due, and reads the sealed generations."""
        with self._stepping:
            self._step()

    def _step(self) -> None:
        with self.lock:
            beyond = self._seals - len(SEAL_AT) + 1
            due = SEAL_AT[self._seals] if beyond <= 0 else SEAL_AT[-1] + beyond * SEAL_AFTER
            seal = (
                self._interval is not None
                and time.monotonic() - self._started >= due * self._interval
            )
            self._seals += seal
        if seal:
            for t in self._tables:
                t.table.change_log.request_seal()
        for t in self._tables:
            self._read_sealed(t)

    def take(self) -> tuple[dict[str, list[TableDelta]], dict[str, tuple]]:
        """At a boundary (``lock`` held): the generations read, and the keys of those
        being read (their reads are dropped: the boundary reads the keys again); a
        new interval begins."""
        staged, inflight = self._staged, self._inflight
        self._staged = {t.name: [] for t in self._tables}
        self._inflight = {}
        self._epoch += 1
        # The interval: training time since the previous publish returned (``resume``).
        interval = time.monotonic() - self._started
        self._interval = interval if 0 <= interval < math.inf else None
        self._seals = 0
        self._started = math.inf  # no seal until ``resume``
        return staged, inflight

    def resume(self) -> None:
        """The publish that called ``take`` returned: training goes on from here."""
        with self.lock:
            self._started = time.monotonic()

    def _read_sealed(self, t) -> None:
        log = t.table.change_log
        with self.lock:
            sealed = log.take_sealed()
            if sealed is None:
                return
            epoch = self._epoch
            self._inflight[t.name] = sealed
            generation = len(self._staged[t.name])
        touched, removed = sealed
        # The chunks' rows and scores go one after the other into one buffer per
        # field, the publisher's for this table and generation (reused: no faults).
        slices = _Slices(self._take, f"{t.name}.gen{generation}", touched.numel())
        parts = []
        for begin in range(0, max(touched.numel(), 1), CHUNK_KEYS):
            with self.lock:
                if self._epoch != epoch:
                    return  # a boundary took the keys
                removed_part = removed if begin == 0 else removed[:0]
                chunk = touched[begin : begin + CHUNK_KEYS]
                parts.append(read_entries(t.table, chunk, removed_part, self._optim, slices))
        with self.lock:
            if self._epoch != epoch:
                return
            del self._inflight[t.name]
            self._staged[t.name].append(_concat(parts, slices))


class _Slices:
    """``out(field, rows, width, dtype)`` for ``read_entries`` over the chunks of one
    generation: consecutive slices of one buffer per field, sized for ``total`` keys."""

    def __init__(self, take, prefix: str, total: int) -> None:
        self._take, self._prefix, self._total = take, prefix, total
        self.buffers: dict[str, torch.Tensor] = {}
        self.used: dict[str, int] = {}

    def __call__(self, field: str, rows: int, width: int, dtype: torch.dtype) -> torch.Tensor:
        if field not in self.buffers:
            self.buffers[field] = self._take(f"{self._prefix}.{field}", self._total, width, dtype)
            self.used[field] = 0
        begin = self.used[field]
        self.used[field] = begin + rows
        return self.buffers[field][begin : begin + rows]

    def filled(self, field: str) -> torch.Tensor:
        return self.buffers[field][: self.used[field]]


def _concat(parts: list[TableDelta], slices: _Slices) -> TableDelta:
    """One entry of a generation's chunks (their rows and scores already adjacent)."""

    def cat(field):
        tensors = [getattr(p, field) for p in parts]
        return None if tensors[0] is None else torch.cat(tensors)

    rows = slices.filled("rows")
    dim = parts[0].values.shape[1]
    return TableDelta(
        keys=cat("keys"),
        values=rows[:, :dim],
        scores=slices.filled("scores"),
        state=rows[:, dim:] if parts[0].state is not None else None,
        timestamps=cat("timestamps"),
        tombstones=cat("tombstones"),
    )


__all__ = ["PreCapture", "merge", "read_entries"]
