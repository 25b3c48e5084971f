"""The slow tier of a cached table: the built-in ``HashTableStorage`` and the factory.

``make_backing_storage`` is the one place that decides what sits behind a cache:
the user's ``external_storage`` when set, else a ``ScoredHashTable`` of the table's
full ``max_capacity`` whose rows are in host memory (on a GPU: ``backing_fast_rows``).
"""

import torch

from dynemb import _ops
from dynemb.dynamicemb_config import DynamicEmbTableOptions
from dynemb.table.placement import backing_fast_rows
from dynemb.table.scored_hash_table import ScoredHashTable
from dynemb.tiering.storage import Storage, StorageSpec


class HashTableStorage(Storage):
    """``Storage`` over a ``ScoredHashTable`` (rows include the optimizer state).

    Args:
        table: the table; its ``extra_columns`` are the state columns.

    Scores are stored exactly as given (``insert`` writes them after the upsert),
    so a row that goes through the cache keeps its score.
    """

    def __init__(self, table: ScoredHashTable) -> None:
        self.table = table

    def find(self, keys):
        t = self.table
        with t._lock.read():
            s = t._storage
            # One probe per key, then whole-batch gathers by slot (absent keys read
            # slot 0, then get zeros): probing twice, for rows and for scores, cost
            # more than the gathers.
            slots = _ops.table_find_slots(s.tensors(), keys)
            found = slots >= 0
            at = slots.clamp(min=0)
            rows = s.rows(at, t._layout.row_width)
            scores = s.scores[at] if t._layout.keeps_scores else torch.zeros_like(keys)
        missing = ~found
        rows.index_fill_(0, torch.nonzero(missing, as_tuple=True)[0], 0)  # those rows only
        return rows, scores.masked_fill_(missing, 0), found

    def insert(self, keys, rows, scores):
        t = self.table
        n, width = keys.numel(), t._layout.row_width
        rows = rows.contiguous()
        saved_scores = scores.contiguous() if t._layout.keeps_scores else None
        evicted = [
            torch.empty(n, dtype=torch.int64, device=t.device),
            torch.empty((n, width), dtype=t.value_dtype, device=t.device),
            torch.empty(n, dtype=torch.int64, device=t.device),
        ]

        def op(table, policy, init, k, _scores, _values, ev, per_key):
            # One pass: whole rows (policy dim = row width) and their scores exactly as
            # given (CUSTOMIZED admits by them); per_key: the positions (re)tried.
            part = per_key.numel() != n
            r = rows[per_key] if part else rows
            sc = saved_scores[per_key] if part and saved_scores is not None else saved_scores
            policy = [*policy[:4], width]
            return _ops.table_restore(table, policy, init, k, r, None, sc, None, ev)

        step = t._step  # a write-back is not a training step (STEP scores count those)
        positions = torch.arange(n, device=t.device)
        status = t._upsert(
            op, keys, None, positions, evicted, return_status=True, per_key=positions
        )
        t._step = step
        stats = t.last_stats
        if not stats.evicted and not stats.failed:  # the common case: nothing to report
            return evicted[0][:0], evicted[1][:0], evicted[2][:0]
        out = status == _ops.Status.EVICTED
        lost = status == _ops.Status.FAILED
        if not bool(lost.any()):
            return evicted[0][out], evicted[1][out], evicted[2][out]
        return (
            torch.cat([evicted[0][out], keys[lost]]),
            torch.cat([evicted[1][out], rows[lost]]),
            torch.cat([evicted[2][out], scores[lost]]),
        )

    def erase(self, keys):
        return self.table.erase(keys)

    def export_batch(self, offset, n):
        return self.table.export_batch(offset, n, include_extra=True)

    def end_offset(self):
        return self.table.capacity()

    def size(self):
        return self.table.size()


def make_backing_storage(
    options: DynamicEmbTableOptions,
    spec: StorageSpec,
    extra_init: float = 0.0,
    spill_directory: str | None = None,
) -> Storage:
    """Builds the slow tier of a cached table.

    Args:
        options: the table's options (``external_storage``, ``initializer_args``,
            ``score_strategy``, ``init_capacity``, ``seed``).
        spec: sizes, dtype and device of the rows.
        extra_init: initial value of the optimizer-state columns.
        spill_directory: the built-in table's spill directory (rows in memory-mapped
            files, see ScoredHashTable), or None (in memory).

    Returns:
        The user's storage (``options.external_storage(spec)``), or a
        ``HashTableStorage`` over a ScoredHashTable of ``spec.capacity`` rows.

    Raises:
        TypeError: when ``external_storage`` does not build a Storage.
    """
    if options.external_storage is not None:
        storage = options.external_storage(spec)
        if not isinstance(storage, Storage):
            raise TypeError(
                f"table {spec.table_name!r}: external_storage must build a "
                f"dynemb.tiering.Storage, {options.external_storage!r} built {storage!r}"
            )
        return storage
    table = ScoredHashTable(
        dim=spec.dim,
        capacity=spec.capacity,
        init_capacity=options.init_capacity,
        bucket_capacity=spec.bucket_capacity,
        score_strategy=spec.score_strategy,
        value_dtype=spec.value_dtype,
        extra_columns=spec.state_columns,
        initializer=options.initializer_args,
        seed=options.seed,
        device=spec.device,
        extra_init=extra_init,
        fast_rows=backing_fast_rows(spec.device),
        spill_directory=spill_directory,
    )
    return HashTableStorage(table)


__all__ = ["HashTableStorage", "make_backing_storage"]
