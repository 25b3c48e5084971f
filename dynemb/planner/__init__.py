"""Sharding planner for models with dynamic tables (names mirror ``dynamicemb.planner``).

Mark a table dynamic with ``DynamicEmbParameterConstraints(use_dynamicemb=True, ...)``
and plan with ``DynamicEmbeddingShardingPlanner``: dynamic tables are sharded ROW_WISE
(or TABLE_WISE or COLUMN_WISE, when their constraints' ``sharding_types`` ask for it) with
``EmbeddingComputeKernel.CUSTOMIZED_KERNEL`` and their plan entries
(``DynamicEmbParameterSharding``) carry each rank's filled ``DynamicEmbTableOptions``;
every other table is planned by TorchRec as usual. ``recommend_capacities`` sizes
dynamic tables from samples of their id streams (``configs_with_capacities`` hands the
capacities to the planner as ``num_embeddings``).
"""

from dynemb.planner.capacity import (
    BUCKET_ALIGNMENT,
    MAX_BUCKET_CAPACITY,
    get_sharded_table_capacity,
    get_table_value_bytes,
)
from dynemb.planner.constraints import DynamicEmbParameterConstraints
from dynemb.planner.enumerator import DynamicEmbeddingEnumerator
from dynemb.planner.parameter_sharding import DynamicEmbParameterSharding
from dynemb.planner.planner import DynamicEmbeddingShardingPlanner
from dynemb.planner.traffic_capacity import (
    TrafficRates,
    measure_traffic_rates,
    recommend_capacity,
)
from dynemb.planner.traffic_plan import configs_with_capacities, recommend_capacities

__all__ = [
    "BUCKET_ALIGNMENT",
    "MAX_BUCKET_CAPACITY",
    "DynamicEmbeddingEnumerator",
    "DynamicEmbeddingShardingPlanner",
    "DynamicEmbParameterConstraints",
    "DynamicEmbParameterSharding",
    "TrafficRates",
    "configs_with_capacities",
    "get_sharded_table_capacity",
    "get_table_value_bytes",
    "measure_traffic_rates",
    "recommend_capacities",
    "recommend_capacity",
]
