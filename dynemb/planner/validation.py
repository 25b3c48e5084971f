"""Checks that a planner's constraints agree with the model's table configs.

Every error names the table and the offending value and is raised before planning.
"""

from collections.abc import Mapping, Sequence

import torch
from torchrec.distributed.planner.types import ParameterConstraints
from torchrec.modules.embedding_configs import BaseEmbeddingConfig, EmbeddingBagConfig

from dynemb.config.table_options import DynamicEmbTableOptions
from dynemb.distributed.sharding_names import (
    DYNAMIC_KERNEL_NAME,
    DYNAMIC_SHARDING_TYPES,
    POOLED_ONLY_SHARDING_TYPES,
)
from dynemb.planner.capacity import check_bucket_capacity
from dynemb.planner.constraints import is_dynamic
from dynemb.planner.rank_options import planner_inputs

__all__ = ["check_planner_inputs"]

_EMBEDDING_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def check_planner_inputs(
    eb_configs: Sequence[BaseEmbeddingConfig],
    constraints: Mapping[str, ParameterConstraints] | None,
) -> dict[str, BaseEmbeddingConfig]:
    """Returns the configs by table name after checking ``constraints`` against them.

    Raises:
        TypeError: a config that is not a TorchRec embedding config, a constraint that is
            not a ``ParameterConstraints``, options that are not ``DynamicEmbTableOptions``.
        ValueError: duplicate table names; a constraint for a table not in ``eb_configs``;
            CUSTOMIZED_KERNEL on a table without ``use_dynamicemb``; a dynamic table
            constrained to other sharding types than ROW_WISE / TABLE_WISE / COLUMN_WISE /
            TABLE_ROW_WISE (this one for EmbeddingBagConfig tables only) or to other
            kernels than CUSTOMIZED_KERNEL; options disagreeing with the config or out of range.
    """
    configs = _configs_by_name(eb_configs)
    for name, c in (constraints or {}).items():
        if name not in configs:
            raise ValueError(
                f"constraints name table {name!r}, which is not in eb_configs "
                f"(tables: {sorted(configs)}); pass every table config of the model"
            )
        if not isinstance(c, ParameterConstraints):
            raise TypeError(
                f"table {name!r}: constraints must be ParameterConstraints, got {type(c).__name__}"
            )
        if is_dynamic(c):
            _check_dynamic(name, c, configs[name])
        elif DYNAMIC_KERNEL_NAME in (c.compute_kernels or ()):
            raise ValueError(
                f"table {name!r}: compute kernel {DYNAMIC_KERNEL_NAME!r} is for dynamic tables; "
                "use DynamicEmbParameterConstraints(use_dynamicemb=True, ...)"
            )
    return configs


def _configs_by_name(eb_configs: Sequence[BaseEmbeddingConfig]) -> dict[str, BaseEmbeddingConfig]:
    configs: dict[str, BaseEmbeddingConfig] = {}
    for config in eb_configs:
        if not isinstance(config, BaseEmbeddingConfig):
            raise TypeError(
                f"eb_configs must hold EmbeddingBagConfig / EmbeddingConfig, got {config!r}"
            )
        if config.name in configs:
            raise ValueError(f"eb_configs name table {config.name!r} twice")
        configs[config.name] = config
    return configs


def _check_dynamic(name: str, c: ParameterConstraints, config: BaseEmbeddingConfig) -> None:
    # An empty list means "unconstrained" to TorchRec; keep that meaning.
    other = sorted(set(c.sharding_types or ()) - set(DYNAMIC_SHARDING_TYPES))
    if other:
        raise ValueError(
            f"table {name!r}: a dynamic table is sharded one of {list(DYNAMIC_SHARDING_TYPES)}, "
            f"got sharding_types={c.sharding_types} ({other} unsupported)"
        )
    pooled_only = sorted(set(c.sharding_types or ()) & set(POOLED_ONLY_SHARDING_TYPES))
    if pooled_only and not isinstance(config, EmbeddingBagConfig):
        raise ValueError(
            f"table {name!r}: sharding_types={c.sharding_types} lists {pooled_only}, which "
            f"TorchRec has for pooled (EmbeddingBagConfig) tables only; this table is a "
            f"{type(config).__name__}: use row_wise, table_wise or column_wise"
        )
    if c.compute_kernels and set(c.compute_kernels) != {DYNAMIC_KERNEL_NAME}:
        raise ValueError(
            f"table {name!r}: a dynamic table uses compute kernel {DYNAMIC_KERNEL_NAME!r} only, "
            f"got compute_kernels={c.compute_kernels}; leave compute_kernels unset"
        )
    o = c.dynamicemb_options
    if not isinstance(o, DynamicEmbTableOptions):
        raise TypeError(
            f"table {name!r}: dynamicemb_options must be DynamicEmbTableOptions, got {o!r}"
        )
    o = planner_inputs(o)  # the user's values, not those an earlier plan filled in
    if o.dim is not None and o.dim != config.embedding_dim:
        raise ValueError(
            f"table {name!r}: dynamicemb_options.dim={o.dim} disagrees with the config's "
            f"embedding_dim={config.embedding_dim}; leave dim unset (the planner fills it)"
        )
    try:
        check_bucket_capacity(o.bucket_capacity)
    except ValueError as e:
        raise ValueError(f"table {name!r}: dynamicemb_options.{e}") from None
    if o.init_capacity is not None and (
        isinstance(o.init_capacity, bool) or not isinstance(o.init_capacity, int)
    ):
        raise ValueError(
            f"table {name!r}: dynamicemb_options.init_capacity must be an int or None, "
            f"got {o.init_capacity!r}"
        )
    if o.init_capacity is not None and o.init_capacity < 1:
        raise ValueError(
            f"table {name!r}: dynamicemb_options.init_capacity must be >= 1, got {o.init_capacity}"
        )
    if not isinstance(o.global_hbm_for_values, int) or o.global_hbm_for_values < 0:
        raise ValueError(
            f"table {name!r}: dynamicemb_options.global_hbm_for_values must be an int >= 0 "
            f"(bytes over all ranks), got {o.global_hbm_for_values!r}"
        )
    if o.index_type not in (None, torch.int64):
        raise ValueError(
            f"table {name!r}: dynamicemb_options.index_type must be torch.int64, got {o.index_type}"
        )
    if o.embedding_dtype is not None and o.embedding_dtype not in _EMBEDDING_DTYPES:
        raise ValueError(
            f"table {name!r}: dynamicemb_options.embedding_dtype must be one of "
            f"{_EMBEDDING_DTYPES}, got {o.embedding_dtype}"
        )
    for field in ("initializer_args", "eval_initializer_args"):
        try:
            getattr(o, field).validate()
        except (TypeError, ValueError) as e:
            raise type(e)(f"table {name!r}: dynamicemb_options.{field}: {e}") from None
