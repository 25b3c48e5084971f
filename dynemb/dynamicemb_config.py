"""DynamicEmb's ``dynamicemb.dynamicemb_config``: the option dataclasses, with the enums,
score-strategy helpers, sizing helpers (``get_table_value_bytes``,
``get_sharded_table_capacity``, ``align_to_table_size``) and dtype converters that
module names.

A front module: it re-exports names defined in dynemb's packages (the options:
``dynemb.config.table_options``) and no module of dynemb imports it.
"""

from dynemb.config.dtypes import (
    data_type_to_dtype,
    data_type_to_dyn_emb,
    dyn_emb_to_torch,
    string_to_evict_strategy,
    torch_to_dyn_emb,
)
from dynemb.config.score_strategies import (
    ScoreStrategy,
    check_score_half_life,
    evict_strategy_of,
    normalize_score_strategy,
    resolved_evict_strategy,
    score_strategy_has_timestamp_column,
)
from dynemb.config.table_options import (
    BATCH_SIZE_PER_DUMP,
    DEFAULT_BUCKET_CAPACITY,
    DIST_TYPES,
    FLOAT32_MAX,
    SUPPORTED_DIST_TYPES,
    DynamicEmbInitializerArgs,
    DynamicEmbTableOptions,
    check_float32,
    dtype_to_bytes,
    init_mode_code,
    with_kernel_defaults,
)
from dynemb.config.types import (
    DynamicEmbCheckMode,
    DynamicEmbEvictStrategy,
    DynamicEmbInitializerMode,
    DynamicEmbPoolingMode,
    DynamicEmbScoreStrategy,
)
from dynemb.planner.capacity import (
    align_to_table_size,
    get_sharded_table_capacity,
    get_table_value_bytes,
)

__all__ = [
    "BATCH_SIZE_PER_DUMP",
    "DEFAULT_BUCKET_CAPACITY",
    "SUPPORTED_DIST_TYPES",
    "DynamicEmbCheckMode",
    "DynamicEmbEvictStrategy",
    "DynamicEmbPoolingMode",
    "DynamicEmbScoreStrategy",
    "data_type_to_dtype",
    "data_type_to_dyn_emb",
    "dtype_to_bytes",
    "dyn_emb_to_torch",
    "normalize_score_strategy",
    "score_strategy_has_timestamp_column",
    "string_to_evict_strategy",
    "torch_to_dyn_emb",
    "DynamicEmbInitializerArgs",
    "DynamicEmbInitializerMode",
    "DynamicEmbTableOptions",
    "DIST_TYPES",
    "FLOAT32_MAX",
    "check_float32",
    "check_score_half_life",
    "ScoreStrategy",
    "evict_strategy_of",
    "init_mode_code",
    "resolved_evict_strategy",
    "with_kernel_defaults",
    "align_to_table_size",
    "get_sharded_table_capacity",
    "get_table_value_bytes",
]
