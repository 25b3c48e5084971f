"""Builds a table from its options: a ScoredHashTable, or a CachedTable (caching mode)."""

import os
import warnings

import torch

from dynemb.config.storage import Storage, StorageSpec
from dynemb.config.table_options import DynamicEmbTableOptions
from dynemb.config.types import DynamicEmbScoreStrategy
from dynemb.table.batch_arguments import TIMESTAMP_CODES, strategy_code
from dynemb.table.scored_hash_table import ScoredHashTable
from dynemb.tiering.backing import make_backing_storage
from dynemb.tiering.cached_table import CachedTable
from dynemb.warm_start.table_fill import TableFill

# Slots per cache bucket. DynamicEmb uses 1024 (a GPU warp scans a bucket at once);
# on a CPU every cache eviction scans its whole bucket for the victim: W-train with
# a 25% cache ran 2x faster with 128-slot buckets than with 1024; its slot claims
# took 2.1 ms per batch with 128, 1.4 ms with 64, and with 32 (once the victim scan
# vectorized) ~25% less than with 64, at a 0.3% lower hit rate. Smaller buckets fill
# with pinned rows sooner: with a 10% cache, 32 staged 2.5x the keys 64 did (14.8k
# of 539k) at the same speed. Staged keys are never lost, but cost a private table
# each batch; 16-slot buckets staged keys even with a 25% cache.
CACHE_BUCKET_CAPACITY = 32

MIN_CACHE_ROWS = 16
"""Rows of the smallest cache: one bucket of the narrowest width (16 slots). A
``local_hbm_for_values`` that holds fewer rows gets this cache, as DynamicEmb rounds a
cache smaller than one bucket up to one bucket."""


def cache_rows(options: DynamicEmbTableOptions, state_columns: int) -> int:
    """Rows (embedding + state) that ``local_hbm_for_values`` bytes hold: the cache in
    caching mode, the fast tier of a hybrid table otherwise."""
    width = options.dim + state_columns
    element = torch.empty((), dtype=options.embedding_dtype).element_size()
    return options.local_hbm_for_values // (width * element)


def spill_path(options: DynamicEmbTableOptions, name: str) -> str | None:
    """This rank's spill directory of table ``name`` (None: the table is not spilled)."""
    if options.spill_directory is None:
        return None
    rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
    return os.path.join(options.spill_directory, f"{name}.rank{rank}")


def check_tiering_options(name: str, options: DynamicEmbTableOptions, state_columns: int) -> None:
    """Raises ValueError / TypeError on caching options that cannot work, naming them."""
    o = options
    if not isinstance(o.caching, bool):
        raise TypeError(f"table {name!r}: caching must be a bool, got {o.caching!r}")
    if o.external_storage is not None:
        if not callable(o.external_storage):
            raise TypeError(
                f"table {name!r}: external_storage must be a dynemb.tiering.Storage subclass "
                f"(or a callable StorageSpec -> Storage), got {o.external_storage!r}"
            )
        if isinstance(o.external_storage, Storage):
            raise TypeError(
                f"table {name!r}: external_storage must be a Storage class or factory, "
                f"not an instance ({o.external_storage!r}): each table builds its own"
            )
        if not o.caching:
            raise ValueError(
                f"table {name!r}: external_storage={o.external_storage!r} needs caching=True "
                f"(the kernels read rows from the cache in front of it)"
            )
    if not o.caching:
        return
    hbm = o.local_hbm_for_values
    if isinstance(hbm, bool) or not isinstance(hbm, int) or hbm <= 0:
        raise ValueError(
            f"table {name!r}: caching=True needs local_hbm_for_values > 0 (bytes of cache "
            f"rows), got {hbm!r}"
        )
    if o.external_storage is not None and strategy_code(o.score_strategy) in TIMESTAMP_CODES:
        raise ValueError(  # Storage.find / insert carry one score column a row
            f"table {name!r}: external_storage={o.external_storage!r} cannot keep the "
            f"last-access time of score_strategy={o.score_strategy!r} (a Storage stores one "
            "score a row); use the built-in slow tier (external_storage=None) or a strategy "
            "with one score"
        )


def make_table(
    name: str,
    options: DynamicEmbTableOptions,
    state_columns: int,
    device: torch.device,
    state_init: tuple[float, int] = (0.0, 0),
) -> ScoredHashTable | CachedTable:
    """The table of one DynamicEmbTableOptions (options already checked).

    Caching mode: a cache of ``cache_rows(options)`` rows (rounded to the bucket
    layout; at least ``MIN_CACHE_ROWS``, with a UserWarning when the budget holds
    fewer), buckets of ``min(CACHE_BUCKET_CAPACITY, rows)`` slots, in front of
    ``make_backing_storage`` (with ``spill_directory``: a spilled slow tier).
    Otherwise a ScoredHashTable, hybrid when ``local_hbm_for_values`` holds fewer rows
    than the table (``fast_rows = cache_rows(options)``), spilled with ``spill_path``.
    With ``warm_start``, its keys new to the table read the source (a TableFill).
    ``state_init``: ``(value, zeros)`` of a new row's state columns (OptimizerConfig's
    ``state_init``).
    """
    table = _make_table(name, options, state_columns, device, state_init)
    if options.warm_start is not None:
        dtype = table.value_dtype
        table.warm_start = TableFill(options.warm_start, options.dim, state_columns, dtype, name)
    return table


def _make_table(name, options, state_columns, device, state_init):
    o = options
    extra_init, extra_zeros = state_init
    spill_directory = spill_path(o, name)
    if not o.caching:
        fast_rows = cache_rows(o, state_columns) if o.local_hbm_for_values else None
        return ScoredHashTable(
            dim=o.dim,
            capacity=o.max_capacity,
            init_capacity=o.init_capacity,
            bucket_capacity=o.bucket_capacity,
            score_strategy=o.score_strategy,
            value_dtype=o.embedding_dtype,
            extra_columns=state_columns,
            extra_init=extra_init,
            extra_zeros=extra_zeros,
            initializer=o.initializer_args,
            seed=o.seed,
            column_offset=o.column_offset,
            device=device,
            fast_rows=fast_rows,
            spill_directory=spill_directory,
            score_half_life_steps=o.score_half_life_steps,
        )
    rows = cache_rows(o, state_columns)
    if rows < MIN_CACHE_ROWS:
        warnings.warn(
            f"table {name!r}: local_hbm_for_values={o.local_hbm_for_values} bytes hold "
            f"{rows} rows of dim + optimizer state = {o.dim + state_columns} columns, "
            f"less than one cache bucket; the cache gets one bucket of {MIN_CACHE_ROWS} rows",
            UserWarning,
            stacklevel=2,
        )
        rows = MIN_CACHE_ROWS
    bucket = min(CACHE_BUCKET_CAPACITY, rows // 16 * 16)
    cache = ScoredHashTable(
        dim=o.dim,
        capacity=rows,
        bucket_capacity=bucket,
        score_strategy=DynamicEmbScoreStrategy.STEP,
        value_dtype=o.embedding_dtype,
        extra_columns=state_columns,
        extra_init=extra_init,
        extra_zeros=extra_zeros,
        initializer=o.initializer_args,
        seed=o.seed,
        column_offset=o.column_offset,
        device=device,
        # New rows as the whole table would initialise them (bounds depend on capacity).
        initializer_capacity=o.max_capacity,
    )
    spec = StorageSpec(
        dim=o.dim,
        state_columns=state_columns,
        value_dtype=o.embedding_dtype,
        capacity=o.max_capacity,
        score_strategy=o.score_strategy,
        bucket_capacity=o.bucket_capacity,
        device=device,
        table_name=name,
    )
    storage = make_backing_storage(
        o, spec, extra_init=extra_init, spill_directory=spill_directory, extra_zeros=extra_zeros
    )
    return CachedTable(
        cache, storage, o.score_strategy, o.max_capacity, name, o.score_half_life_steps
    )


__all__ = [
    "CACHE_BUCKET_CAPACITY",
    "MIN_CACHE_ROWS",
    "cache_rows",
    "check_tiering_options",
    "make_table",
]
