"""The per-rank options of a sharded dynamic table, filled from its config."""

import copy
import dataclasses
import math
import warnings
from collections.abc import Iterable

import torch
from torchrec.distributed.types import ShardingType
from torchrec.modules.embedding_configs import BaseEmbeddingConfig, data_type_to_dtype

from dynemb.config.score_strategies import resolved_evict_strategy
from dynemb.config.table_options import DynamicEmbInitializerArgs, DynamicEmbTableOptions
from dynemb.config.types import DynamicEmbInitializerMode
from dynemb.planner.capacity import effective_bucket_capacity, get_sharded_table_capacity

__all__ = [
    "FILLED_FIELDS",
    "fill_rank_options",
    "fill_user_options",
    "local_hbm_bytes",
    "planner_inputs",
    "table_ranks",
]

FILLED_FIELDS = (
    "dim",
    "max_capacity",
    "init_capacity",
    "bucket_capacity",
    "local_hbm_for_values",
    "initializer_args",
    "embedding_dtype",
    "index_type",
    "evict_strategy",
)
"""The fields ``fill_rank_options`` fills, which a plan also writes into the user's options."""

# Set on a user's options by fill_user_options: {field: (the user's value, the plan's)}.
_PLANNED = "_dynemb_planned"


def table_ranks(sharding_type: str, world_size: int, node_size: int | None = None) -> int:
    """Ranks a dynamic table's keys are spread over: ``world_size`` row-wise,
    ``node_size`` table-row-wise (the ranks of one node: the topology's
    ``intra_group_size``, TorchRec's split of a TWRW table), one table-wise (every key
    on the rank holding the table) and column-wise (every key on every rank holding a
    slice).

    Raises:
        ValueError: table-row-wise without a ``node_size`` that divides ``world_size``.

    Example::

        table_ranks("table_wise", 8)  # 1
        table_ranks("table_row_wise", 8, node_size=4)  # 4
    """
    if sharding_type == ShardingType.ROW_WISE.value:
        return world_size
    if sharding_type == ShardingType.TABLE_ROW_WISE.value:
        if node_size is None or node_size < 1 or world_size % node_size:
            raise ValueError(
                f"table_row_wise: node_size must divide world_size={world_size}, got {node_size}"
            )
        return node_size
    return 1


def local_hbm_bytes(options: DynamicEmbTableOptions, world_size: int) -> int:
    """Per-rank bytes of the fast tier: ``ceil(global_hbm_for_values / world_size)``."""
    return -(-options.global_hbm_for_values // world_size)


def fill_rank_options(
    name: str,
    config: BaseEmbeddingConfig,
    options: DynamicEmbTableOptions,
    world_size: int,
) -> DynamicEmbTableOptions:
    """Returns a copy of ``options`` holding what one rank's table of ``config`` needs.

    - ``bucket_capacity``: kept; MAX_BUCKET_CAPACITY: rows per rank rounded up to 16.
    - ``max_capacity``: ``ceil(num_embeddings / world_size)`` rounded up to buckets.
    - ``init_capacity``: ``None`` gives ``max_capacity``; otherwise (rows per rank)
      rounded up to buckets and clamped to ``[bucket_capacity, max_capacity]``.
    - ``dim``: the config's ``embedding_dim``.
    - ``local_hbm_for_values``: ``ceil(global_hbm_for_values / world_size)`` (replaces
      any value set by the user: the global budget is the input).
    - UNIFORM initializer bounds left ``None``: ``-+sqrt(1 / num_embeddings)``.
    - ``embedding_dtype`` ``None``: the config's ``data_type``; ``index_type`` ``None``:
      int64; ``evict_strategy``: the one ``score_strategy`` implies.

    ``options`` and its initializer args are not modified; ``admit_strategy``,
    ``admission_counter`` and ``external_storage`` stay shared (user objects).

    Raises:
        ValueError: filled initializer bounds that are not ``lower < upper`` (a user
            bound on the wrong side of the default one).

    Example::

        # num_embeddings=1000, world_size=3, bucket_capacity=128, init_capacity=100
        # -> bucket_capacity=128, max_capacity=384, init_capacity=128, dim=embedding_dim
    """
    bucket = effective_bucket_capacity(config.num_embeddings, world_size, options.bucket_capacity)
    max_capacity = get_sharded_table_capacity(config, world_size, bucket)
    if options.init_capacity is None:
        init_capacity = max_capacity
    else:
        aligned = -(-options.init_capacity // bucket) * bucket
        init_capacity = min(max(aligned, bucket), max_capacity)
    initializer = _with_default_bounds(options.initializer_args, config.num_embeddings)
    try:
        initializer.validate()
    except ValueError as e:
        raise ValueError(f"table {name!r}: dynamicemb_options.initializer_args: {e}") from None
    return dataclasses.replace(
        options,
        dim=config.embedding_dim,
        max_capacity=max_capacity,
        init_capacity=init_capacity,
        bucket_capacity=bucket,
        local_hbm_for_values=local_hbm_bytes(options, world_size),
        initializer_args=initializer,
        eval_initializer_args=copy.deepcopy(options.eval_initializer_args),
        embedding_dtype=options.embedding_dtype or data_type_to_dtype(config.data_type),
        index_type=options.index_type or torch.int64,
        evict_strategy=resolved_evict_strategy(name, options),
    )


def _with_default_bounds(
    args: DynamicEmbInitializerArgs, num_embeddings: int
) -> DynamicEmbInitializerArgs:
    # The bounds depend on the whole table, which a rank's shard does not know.
    if args.mode != DynamicEmbInitializerMode.UNIFORM:
        return copy.deepcopy(args)
    bound = math.sqrt(1.0 / num_embeddings)
    return dataclasses.replace(
        args,
        lower=-bound if args.lower is None else args.lower,
        upper=bound if args.upper is None else args.upper,
    )


def planner_inputs(options: DynamicEmbTableOptions) -> DynamicEmbTableOptions:
    """``options`` as the user gave them to the plan that filled them in place.

    A plan writes its per-rank values into the user's options (``fill_user_options``);
    planning again (another planner, another world size) must start from the user's
    values, not from the last plan's. Each field that still holds the value a plan
    wrote gets the user's value back; a field the user set since is the user's. Returns
    ``options`` itself when no plan filled it, else a copy (``options`` is not modified).
    """
    record = getattr(options, _PLANNED, None)
    if not record:
        return options
    restored = {
        field: user
        for field, (user, filled) in record.items()
        if _same(getattr(options, field), filled)
    }
    return dataclasses.replace(options, **restored) if restored else options


def fill_user_options(
    entries: Iterable[tuple[str, DynamicEmbTableOptions, DynamicEmbTableOptions]],
) -> None:
    """Writes each table's filled per-rank values (``FILLED_FIELDS`` of its plan entry's
    options) into the user's options object, in place, as DynamicEmb's planner does.

    ``entries``: ``(table name, the user's options, the plan entry's options)``. One
    options object shared by several tables gets the values its tables agree on; a field
    they disagree on (``max_capacity`` of tables of different sizes, ...) keeps the
    user's value, with a UserWarning naming the tables and fields: each table's values
    are in its plan entry. A field the user's value already equals is not written (the
    user's initializer args stay the user's object).
    """
    groups: dict[int, tuple[DynamicEmbTableOptions, list]] = {}
    for name, user, filled in entries:
        groups.setdefault(id(user), (user, []))[1].append((name, filled))
    for user, tables in groups.values():
        inputs = planner_inputs(user)
        record, disagree = {}, []
        for field in FILLED_FIELDS:
            given = getattr(inputs, field)
            values = [getattr(filled, field) for _, filled in tables]
            if any(not _same(v, values[0]) for v in values[1:]):
                disagree.append(field)
                value = given
            else:
                value = values[0]
            if _same(value, given):
                value = given  # e.g. the user's initializer args object, not a copy
            else:
                record[field] = (given, value)
            setattr(user, field, value)
        object.__setattr__(user, _PLANNED, record)
        if disagree:
            names = sorted(name for name, _ in tables)
            warnings.warn(
                f"tables {names} share one DynamicEmbTableOptions object; their plans "
                f"disagree on {disagree}, which keep the values you gave: read each "
                "table's values from its plan entry "
                "(plan.plan[path][table].dynamicemb_options), or give each table its own "
                "options",
                UserWarning,
                stacklevel=3,
            )


def _same(a: object, b: object) -> bool:
    return a is b or (type(a) is type(b) and a == b)
