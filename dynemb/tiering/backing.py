"""The slow tier of a cached table: the built-in ``HashTableStorage``, the factory, and
the score context of a cached table whose slow tier is not built in.

``make_backing_storage`` is the one place that decides what sits behind a cache:
the user's ``external_storage`` when set, else a ``ScoredHashTable`` of the table's
full ``max_capacity`` whose rows are in host memory (on a GPU: ``backing_fast_rows``).
"""

import time

from dynemb.config.storage import Storage, StorageSpec
from dynemb.config.table_options import DynamicEmbTableOptions
from dynemb.table.placement import backing_fast_rows
from dynemb.table.scored_hash_table import ScoredHashTable


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
        return self.table.find_entries(keys)

    def insert(self, keys, rows, scores):
        return self.table.write_back(keys, rows, scores)

    def erase(self, keys):
        return self.table.erase(keys)

    def export_batch(self, offset, n):
        return self.table.export_batch(offset, n, include_extra=True)

    def end_offset(self):
        return self.table.capacity()

    def size(self):
        return self.table.size()


class ScoreContext:
    """Step counter, clock and CUSTOMIZED score of a cached table whose storage is not
    built in (the names of ScoredHashTable's, which holds them when it is)."""

    def __init__(self) -> None:
        self.score_step = 0
        self.now = time.monotonic_ns
        self.custom_score: int | None = None


def make_backing_storage(
    options: DynamicEmbTableOptions,
    spec: StorageSpec,
    extra_init: float = 0.0,
    spill_directory: str | None = None,
    extra_zeros: int = 0,
) -> Storage:
    """Builds the slow tier of a cached table.

    Args:
        options: the table's options (``external_storage``, ``initializer_args``,
            ``score_strategy``, ``init_capacity``, ``seed``).
        spec: sizes, dtype and device of the rows.
        extra_init: initial value of the optimizer-state columns.
        extra_zeros: the first state columns start at 0 instead (FTRL's linear term).
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
        column_offset=options.column_offset,
        device=spec.device,
        extra_init=extra_init,
        extra_zeros=extra_zeros,
        fast_rows=backing_fast_rows(spec.device),
        spill_directory=spill_directory,
        score_half_life_steps=options.score_half_life_steps,
    )
    return HashTableStorage(table)


__all__ = ["HashTableStorage", "ScoreContext", "make_backing_storage"]
