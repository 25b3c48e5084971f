"""``DeltaPublisher``: training publishes a base checkpoint, then versioned deltas of
what its dynamic tables changed since the previous one.

How the changes are found: the publisher attaches a ``ChangeLog``
(dynemb/table/change_log.py) to every dynamic table of the model, which records the
keys each upsert stores and each key that leaves (evicted by an upsert, erased,
cleared). A delta holds, per table, the current row (and score, optimizer state with
``optim``) of every key touched since the previous delta and still stored, and a
tombstone for every key removed and not stored again. Unlike a score threshold (the
incremental dump's), the log is exact under every score strategy (LFU counts and
CUSTOMIZED scores say nothing of time; NO_EVICTION keeps no score), and a delta
costs time and space in proportion to the keys touched, not to the table.
"""

from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from dynemb.checkpoint.dump import DynamicEmbDump, committed_dump
from dynemb.checkpoint.tables import named_tables
from dynemb.deltas.format import TableDelta, table_delta_meta, write_delta
from dynemb.table.change_log import ChangeLog
from dynemb.table.scored_hash_table import ScoredHashTable

BASE = "base"


class DeltaPublisher:
    """Publishes a model's dynamic tables as a base checkpoint plus versioned deltas.

    Creating it starts tracking (nothing is tracked without one); ``close`` stops.
    Call ``publish_base`` once, then ``publish`` at batch boundaries (after the
    optimizer step), from the training thread.

    Args:
        model: a single-process (DMP-)sharded model, a sharded collection, or a
            BatchedDynamicEmbeddingTables.
        directory: where ``base/`` (a DynamicEmbDump checkpoint) and ``delta-<N>/``
            are written (created if needed).
        optim: also publish each upserted row's optimizer state.

    Raises:
        ValueError: the model has no dynamic table, a table is in caching mode (its
            rows move between tiers; not supported), a table is already tracked by
            another publisher, or the model spans several processes.

    Example::

        >>> publisher = DeltaPublisher(model, "/deltas")
        >>> publisher.publish_base()            # version 0: /deltas/base
        >>> for step, batch in enumerate(loader, 1):
        ...     train_step(batch)
        ...     if step % 100 == 0:
        ...         publisher.publish()         # 1, 2, ...: /deltas/delta-00000001, ...
    """

    def __init__(self, model: nn.Module, directory: str | Path, optim: bool = False) -> None:
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            raise ValueError(
                f"DeltaPublisher: the model spans {dist.get_world_size()} processes; "
                "deltas are published from single-process models only"
            )
        tables = named_tables(model)
        if not tables:
            raise ValueError("DeltaPublisher: the model has no dynamic embedding table")
        for t in tables:
            table = t.group.tables[t.index]
            if not isinstance(table, ScoredHashTable):
                raise ValueError(
                    f"DeltaPublisher: table {t.name!r} is in caching mode "
                    f"({type(table).__name__}); deltas need tables without a cache"
                )
            if table.change_log is not None:
                raise ValueError(f"DeltaPublisher: table {t.name!r} is already tracked")
        self.model = model
        self.directory = Path(directory)
        self.optim = optim
        self.version: int | None = None  # None until publish_base
        self.base_dump_id: str | None = None
        self._tables = tables
        for t in tables:
            t.table.change_log = ChangeLog()

    @property
    def base_path(self) -> Path:
        return self.directory / BASE

    def publish_base(self) -> int:
        """Writes the full checkpoint ``<directory>/base`` (DynamicEmbDump, dynemb's
        format, ``optim`` as given) and starts the chain: returns version 0.

        Raises:
            ValueError: a base was published already by this publisher.
            FileExistsError: ``<directory>/base`` holds a checkpoint already.
        """
        if self.version is not None:
            raise ValueError(
                f"DeltaPublisher.publish_base: the base is published (now at version {self.version})"
            )
        for t in self._tables:  # what changed before the base is in the base
            t.table.change_log.take()
        DynamicEmbDump(self.base_path, self.model, optim=self.optim)
        self.base_dump_id = committed_dump(self.base_path)
        self.version = 0
        return 0

    def publish(self) -> int:
        """Writes the next delta (every change since the previous one) atomically;
        returns its version (1, 2, ...).

        Raises:
            ValueError: no base published yet.
            OSError: a file could not be written (naming it): nothing is committed,
                and the changes stay in the next delta.
        """
        if self.version is None:
            raise ValueError("DeltaPublisher.publish: call publish_base() first")
        taken = [(t, *t.table.change_log.take()) for t in self._tables]
        try:
            tables = {
                t.name: self._table_delta(t, touched, removed) for t, touched, removed in taken
            }
            write_delta(self.directory, self.version + 1, self.base_dump_id, self.optim, tables)
        except BaseException:
            for t, touched, removed in taken:  # not published: they go in the next one
                t.table.change_log.touched(touched)
                t.table.change_log.removed(removed)
            raise
        self.version += 1
        return self.version

    def close(self) -> None:
        """Stops tracking: the tables record nothing any more."""
        for t in self._tables:
            t.table.change_log = None

    def _table_delta(self, t, touched: torch.Tensor, removed: torch.Tensor) -> tuple:
        table: ScoredHashTable = t.table
        device = table.device
        rows, scores, found = table.find_entries(touched.to(device))
        keys = touched[found.cpu()]
        rows, scores = rows[found].cpu(), scores[found].cpu()
        state_columns = table.extra_columns if self.optim else 0
        stored = table.find_slots(removed.to(device)) >= 0
        delta = TableDelta(
            keys=keys,
            values=rows[:, : table.dim].contiguous(),
            scores=scores if table.keeps_scores else torch.zeros_like(keys),
            state=rows[:, table.dim :].contiguous() if self.optim else None,
            timestamps=table.get_timestamps(keys.to(device)).cpu()
            if table.keeps_timestamps
            else None,
            tombstones=removed[~stored.cpu()],
        )
        meta = table_delta_meta(
            table.dim, table.value_dtype, state_columns, str(table.score_strategy)
        )
        return meta, delta


__all__ = ["BASE", "DeltaPublisher"]
