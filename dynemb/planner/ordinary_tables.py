"""Ordinary tables held as dynamic ones (the planner's ``ordinary_tables_as_dynamic``).

TorchRec's CPU kernels for ordinary tables have no Adam; dynemb's have. With the
switch, each table of ``eb_configs`` that is not dynamic is planned as a dynamic
table that keeps an ordinary table's meaning:

- ids are ``[0, num_embeddings)`` (others are rejected by the input dist), routed in
  TorchRec's row-wise blocks (``dist_type="continuous"``);
- every row of a rank's block is stored when the table is built, initialised as
  TorchRec's CPU kernels do (``uniform(weight_init_min, weight_init_max)``), then by
  the config's ``init_fn`` in the sharded module's ``reset_parameters`` (as TorchRec),
  so the table never inserts or evicts afterwards (``NO_EVICTION``);
- the capacity has headroom (a hash table cannot be filled to the last slot).
"""

import dataclasses
from collections.abc import Mapping

from torchrec.distributed.planner.types import ParameterConstraints
from torchrec.modules.embedding_configs import BaseEmbeddingConfig

from dynemb.config.table_options import DynamicEmbInitializerArgs, DynamicEmbTableOptions
from dynemb.config.types import (
    DynamicEmbCheckMode,
    DynamicEmbInitializerMode,
    DynamicEmbScoreStrategy,
)
from dynemb.distributed.sharding_names import DYNAMIC_KERNEL_NAME, DYNAMIC_SHARDING_TYPE
from dynemb.planner.constraints import DynamicEmbParameterConstraints, is_dynamic

__all__ = ["ordinary_table_constraints", "with_headroom"]


def _options(config: BaseEmbeddingConfig) -> DynamicEmbTableOptions:
    return DynamicEmbTableOptions(
        dist_type="continuous",
        score_strategy=DynamicEmbScoreStrategy.NO_EVICTION,
        safe_check_mode=DynamicEmbCheckMode.ERROR,
        initializer_args=DynamicEmbInitializerArgs(
            mode=DynamicEmbInitializerMode.UNIFORM,
            lower=config.get_weight_init_min(),
            upper=config.get_weight_init_max(),
        ),
    )


def ordinary_table_constraints(
    configs: Mapping[str, BaseEmbeddingConfig],
    constraints: Mapping[str, ParameterConstraints] | None,
) -> dict[str, ParameterConstraints]:
    """``constraints`` with every ordinary table of ``configs`` made dynamic.

    A user's ``ParameterConstraints`` of an ordinary table keeps its TorchRec fields
    (pooling factors, batch sizes, ...); ``constraints`` is not modified.

    Raises:
        ValueError: an ordinary table constrained to sharding types or compute kernels
            other than ROW_WISE / CUSTOMIZED_KERNEL (the only ones a dynamic table has).
    """
    merged = dict(constraints or {})
    for name, config in configs.items():
        user = merged.get(name)
        if is_dynamic(user):
            continue
        fields = {}
        if user is not None:
            for attr, allowed in (
                ("sharding_types", DYNAMIC_SHARDING_TYPE),
                ("compute_kernels", DYNAMIC_KERNEL_NAME),
            ):
                given = getattr(user, attr)
                if given is not None and list(given) != [allowed]:
                    raise ValueError(
                        f"table {name!r}: constraints {attr}={list(given)}, but with "
                        f"ordinary_tables_as_dynamic=True an ordinary table is sharded "
                        f"{DYNAMIC_SHARDING_TYPE!r} / {DYNAMIC_KERNEL_NAME!r}; drop {attr} "
                        "or leave the switch off"
                    )
            fields = {f.name: getattr(user, f.name) for f in dataclasses.fields(user)}
            fields = {k: v for k, v in fields.items() if k in _TORCHREC_FIELDS}
        merged[name] = DynamicEmbParameterConstraints(
            **fields, use_dynamicemb=True, dynamicemb_options=_options(config)
        )
    return merged


_TORCHREC_FIELDS = {f.name for f in dataclasses.fields(ParameterConstraints)}


def with_headroom(options: DynamicEmbTableOptions) -> DynamicEmbTableOptions:
    """Filled per-rank options of an ordinary table, with room for all its rows.

    ``init_capacity``: the rank's rows over 3/4, rounded up to buckets;
    ``max_capacity``: twice that (growth, should the build-time fill find a window of
    buckets full).
    """
    bucket = options.bucket_capacity
    # 3/4 full after the build-time fill: NO_EVICTION tables fill to ~90% before growing.
    rows = -(-options.max_capacity * 4 // 3)
    init = -(-rows // bucket) * bucket
    return dataclasses.replace(options, init_capacity=init, max_capacity=2 * init)
