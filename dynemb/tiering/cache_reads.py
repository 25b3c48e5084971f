"""What a cached table's lookups read besides its cache slots: eval rows from both
tiers, and a training batch's rows held in the staging area (staging.py); and its
cache's telemetry. The
``dynemb.table.Table`` members ``eval_rows``, ``batch_rows`` and ``staged_rows`` are the
cache's versions of a table in memory's trivial ones (dynemb/table/memory_batches.py).

``CacheReads`` is a part of CachedTable (it uses the table's ``cache``, ``_staging``,
``_storage_lock`` and ``_settle``, see cache_fill.py).
"""

import torch

from dynemb import _ops
from dynemb.table.table_storage import TableStorage
from dynemb.table.upsert_counts import TableTelemetry
from dynemb.tiering.batch_ledger import BatchHold
from dynemb.tiering.staging import private_table


class CacheReads:
    """Eval reads and a batch's staged rows (a mixin of CachedTable)."""

    @property
    def telemetry(self) -> TableTelemetry:
        """The cache's TableTelemetry: every claim of its slots (training lookups and
        prefetches); its evictions move rows to the slow tier (lost rows: ``cache_stats``)."""
        return self.cache.telemetry

    def find(self, keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """ScoredHashTable.find over both tiers: ``(values (n, dim), found (n,) bool)``,
        zero rows where not found; changes nothing."""
        values, found = self.read_rows(keys.contiguous())
        values[~found] = 0
        return values, found

    def read_rows(self, keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Eval lookup: rows ((n, dim), value dtype) from the cache, else the staging
        area, else the storage; found (n,) bool. Inserts nothing, changes no score."""
        self._settle()
        with self.lock.read():
            s = self.buffers
            slots = _ops.table_find_slots(s.tensors(), keys)
            rows = s.values[slots.clamp(min=0), : self.dim].clone()
            found = slots >= 0
            miss = torch.nonzero(~found, as_tuple=True)[0]
            if miss.numel() and len(self._staging):
                staged_rows, staged = self._staging.rows(keys[miss])
                rows[miss[staged]] = staged_rows[staged, : self.dim]
                found[miss[staged]] = True
                miss = miss[~staged]
            if miss.numel():
                with self._storage_lock:
                    slow_rows, _, slow_found = self._storage_find(keys[miss])
                rows[miss] = slow_rows[:, : self.dim].to(rows.dtype)
                found[miss] = slow_found
        return rows, found

    def eval_rows(self, keys: torch.Tensor) -> tuple[TableStorage, torch.Tensor]:
        """Where an eval lookup reads distinct keys' rows: a private storage of the rows
        found in either tier (``read_rows``), and each key's slot there (-1: not stored).
        Inserts nothing."""
        stored, found = self.read_rows(keys)
        at = torch.nonzero(found, as_tuple=True)[0]
        slots = torch.full_like(keys, -1)
        slots[at] = torch.arange(at.numel(), device=keys.device)
        return private_table(stored[at]), slots

    def batch_rows(
        self, slots: torch.Tensor, batch: BatchHold
    ) -> tuple[TableStorage | None, torch.Tensor]:
        """Where a training forward reads its distinct keys' rows, ``slots`` those of
        its lookup under ``batch``: the cache (``(None, slots)``, read under
        ``lock.read()``) when every key is cached; else one private storage of the
        batch's rows, cached and staged, slot i holding distinct key i's, so the bags
        are pooled in one pass, as without caching."""
        staged = batch.payload
        if staged is None:
            return None, slots
        with self.lock.read():
            rows = staged.batch_rows(self.buffers, slots)
        at = torch.arange(slots.numel(), device=slots.device)
        # -1 for keys held nowhere (not admitted): they read the missing-row initializer
        return rows, torch.where((slots < 0) & (staged.unique_slots < 0), -1, at)

    def staged_rows(self, batch: BatchHold) -> tuple[TableStorage, torch.Tensor] | None:
        """Rows of ``batch`` held outside the cache, which its backward updates as the
        cache's: ``(storage, unique_slots)`` of its staged keys (-1 for the cached
        ones), or None when it staged none."""
        staged = batch.payload
        return None if staged is None else (staged.storage, staged.unique_slots)
