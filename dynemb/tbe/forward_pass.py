"""The forward of BatchedDynamicEmbeddingTables, in phases over the Table protocol
(dynemb/table/protocol.py), the same for every table:

1. split the batch by table and de-duplicate each table's keys (reusing a
   prefetch's result);
2. each table this forward trains begins a batch, in flight until the backward;
3. the slots of each table's distinct keys (a training lookup, grouped where tables
   allow it, or an eval read), and where the rows are read (``batch_rows`` /
   ``eval_rows``);
4. pool (one grouped op call) or gather the rows into the output.

``ForwardPass`` is a part of BatchedDynamicEmbeddingTables (it uses its ``tables``,
``table_options``, ``feature_table_map``, ``pooling_mode``, ``dims``,
``feature_dims``, ``device``, the missing-row lists and ``_prefetched``, and
TableSlots' lookups).
"""

import dataclasses
from typing import Any

import torch

from dynemb import _ops, streams
from dynemb.config.types import DynamicEmbPoolingMode
from dynemb.table.padded_keys import PaddedKeys
from dynemb.tbe.batch_layout import TableBatch, count_accesses, distinct_keys, split_by_table
from dynemb.tbe.grouped_calls import pool_grouped, table_locked

POOLING_CODE = {
    mode: _ops.POOLING_CODES[mode.name]
    for mode in (DynamicEmbPoolingMode.SUM, DynamicEmbPoolingMode.MEAN)
}


@dataclasses.dataclass
class TableForward:
    """What a training forward keeps of one table for its backward.

    Attributes:
        tb: the table's share of the batch.
        unique: (U,) int64 distinct keys; ``inverse``: (n_t,) each index's position in it.
        unique_slots: (U,) int64 their slots at the lookup; ``token``: the table's
            ``mutations`` then (backward finds the keys again if it changed).
        batch: the table's ``begin_batch`` (ended by the backward).
    """

    tb: TableBatch
    unique: torch.Tensor
    unique_slots: torch.Tensor
    inverse: torch.Tensor
    token: int
    batch: Any


class ForwardPass:
    """The forward's phases (a part of BatchedDynamicEmbeddingTables)."""

    def _lookup(self, indices, offsets, weights, batch_size, access_counts=None, bounds=None):
        """Forward without autograd: returns (output, (trains, per-table TableForward or
        None)). ``trains``: this forward's module mode, which decides what its backward
        does. ``access_counts``: (n,) int64 or None, as in ``forward``; ``bounds``: the
        features' first indices (``check_batch_layout``'s; None: read from ``offsets``)."""
        self._start_forward()
        if self.training:  # before this batch's lookups: the rule's chunk of this step
            self._scheduled_erase()
        # 1. The keys are read during this forward only (its backward reads the offsets
        # and weights): a copy of them would cost a pass over the batch for nothing.
        batches = split_by_table(
            indices, offsets, weights, self.feature_table_map, len(self.tables), batch_size,
            copy_keys=False, bounds=bounds,
        )  # fmt: skip
        distincts = self._distinct(batches, access_counts)
        holds = self._begin_batches(batches)  # 2.
        try:  # 3. and 4.
            slots = self._slots(batches, distincts, holds)
            reads = [
                None if s is None else self._rows_read(t, distincts[t][0], s[0], holds[t])
                for t, s in enumerate(slots)
            ]
            out = self._pool(indices.numel(), batch_size, batches, distincts, reads)
        except BaseException:  # no backward will end them
            self._end_batches(holds)
            raise
        saved = [
            None if hold is None else TableForward(tb, d[0], s[0], d[1], s[1], hold)
            for tb, d, s, hold in zip(batches, distincts, slots, holds, strict=True)
        ]
        return out, (self.training, saved)

    def _distinct(self, batches: list, access_counts: torch.Tensor | None = None) -> list:
        """``unique_keys`` of each table's keys (None for absent tables); a training
        batch whose keys a table prefetched reuses the prefetch's result. With
        ``access_counts``, each distinct key's count is the sum of its indices' counts.

        When a table's training lookup reads the device anyway (``takes_padded_keys``:
        a cache's claim), the tables' keys are de-duplicated without a read
        (``PaddedKeys``): ``_slots`` runs those lookups first, and their read takes the
        counts of every table along."""
        reused = [None] * len(batches)
        for t, tb in enumerate(batches):
            if tb is None or not self._inserts(t):
                continue
            b = self.tables[t].upcoming_batch()
            entry = self._prefetched[t].pop(b, None) if b is not None else None
            if entry is not None and torch.equal(entry[0], tb.keys):
                reused[t] = entry[1]
                streams.used_here(entry[1])  # made on the prefetch's stream
        fresh = [tb if r is None else None for tb, r in zip(batches, reused)]
        padded = access_counts is None and any(
            tb is not None and self._takes_padded_keys(t) for t, tb in enumerate(fresh)
        )
        fresh = distinct_keys(fresh, padded)
        distincts = [r if r is not None else f for r, f in zip(reused, fresh)]
        if access_counts is None:
            return distincts
        return [
            None if d is None else count_accesses(d, tb, access_counts)
            for d, tb in zip(distincts, batches, strict=True)
        ]

    def _begin_batches(self, batches: list) -> list:
        """Each table this forward trains begins a batch (None for the others), in
        flight until the backward (or until the graph is dropped unused): no other
        batch evicts its keys meanwhile. A table without keys in it skips one."""
        holds = []
        for t, tb in enumerate(batches):
            hold = None
            if self._inserts(t):
                if tb is None:
                    self.tables[t].skip_batch()
                else:
                    hold = self.tables[t].begin_batch()
            holds.append(hold)
        return holds

    def _end_batches(self, holds: list) -> None:
        """Ends the batches of ``holds`` (None: none begun), every one even if one raises."""
        errors = []
        for table, hold in zip(self.tables, holds, strict=True):
            if hold is not None:
                try:
                    table.end_batch(hold)
                except BaseException as error:  # the others must end all the same
                    errors.append(error)
        if errors:
            raise errors[0]

    def _slots(self, batches: list, distincts: list, holds: list) -> list:
        """Per table ``(unique_slots, mutation count)`` of its distinct keys (None for
        absent tables): training lookups (those that can share one op call in one),
        or ``eval_rows``' slots for a table this forward does not train.

        Padded distinct keys (``_distinct``) are looked up first by the tables that
        take them; then every table's are sized in ``distincts`` (in place), their
        count read with those lookups' read."""
        trained = [t for t, hold in enumerate(holds) if hold is not None]
        early = {
            t: self._table_slots(t, distincts[t], None, holds[t])
            for t in trained
            if isinstance(distincts[t], PaddedKeys) and self._takes_padded_keys(t)
        }
        for t, d in enumerate(distincts):
            if isinstance(d, PaddedKeys):
                distincts[t] = d.sized()
        found = self._grouped_slots(trained, distincts, holds) if trained else {}
        found.update(early)
        slots = []
        for t, (tb, d) in enumerate(zip(batches, distincts, strict=True)):
            if tb is None or holds[t] is None:
                slots.append(None if tb is None else (None, None))
            elif t in found:
                slots.append(found[t])
            else:
                slots.append(self._table_slots(t, d[0], d[2], holds[t]))
        return slots

    def _rows_read(self, t: int, unique: torch.Tensor, slots, hold) -> tuple:
        """Where table t's rows are read: ``(storage or None, slots, missing)``; None
        stands for the table's ``buffers`` under its lock; ``missing``: the init list
        of keys without a row."""
        table = self.tables[t]
        if hold is None:
            storage, slots = table.eval_rows(unique)
            return storage, slots, self._eval_missing[t]
        storage, slots = table.batch_rows(slots, hold)
        return storage, slots, self._train_missing[t]

    def _pool(self, n: int, batch_size: int, batches, distincts, reads) -> torch.Tensor:
        """The output: every present table's bags pooled into their features' columns
        in one grouped call, or (NONE) one row per index in the features' rows."""
        present = [t for t, tb in enumerate(batches) if tb is not None]
        if self.pooling_mode != DynamicEmbPoolingMode.NONE:
            out = torch.empty((batch_size, sum(self.feature_dims)), device=self.device)
            grouped = [
                (t, batches[t], *reads[t][:2], distincts[t][1], reads[t][2]) for t in present
            ]
            pool_grouped(self, self._table_columns, grouped, POOLING_CODE[self.pooling_mode], out)
            return out
        out = torch.empty((n, self.dims[self.feature_table_map[0]]), device=self.device)
        for t in present:
            tb, (storage, slots, missing) = batches[t], reads[t]
            table = self.tables[t]
            with table_locked(table, storage, write=False):
                tensors = (table.buffers if storage is None else storage).tensors()
                rows = _ops.embedding_gather(
                    tensors, slots[distincts[t][1]], tb.keys, missing,
                    self.table_options[t].seed, table.dim,
                )  # fmt: skip
            start = 0
            for a, b in tb.index_ranges:
                out[a:b] = rows[start : start + b - a]
                start += b - a
        return out
