"""The planner and enumerator with table-row-wise dynamic tables (4 ranks, 2 a node):
constraints honoured, a node's share of capacity and memory on each of its ranks,
costed beside row-wise, refused for sequence tables, not offered to ordinary tables
on cpu unless asked."""

import dataclasses

import pytest
from torchrec.distributed.planner import ParameterConstraints, Topology

from dynemb.optimizer import EmbOptimType
from dynemb.planner import (
    DynamicEmbeddingEnumerator,
    DynamicEmbeddingShardingPlanner,
    DynamicEmbParameterSharding,
    get_table_value_bytes,
)
from dynemb.planner.rank_options import table_ranks
from dynemb.shard import DynamicEmbeddingBagCollectionSharder, DynamicEmbeddingCollectionSharder
from tests.support.planner_models import (
    DYNAMIC_KERNEL,
    ROW_WISE,
    Model,
    all_configs,
    make_constraints,
)

pytestmark = pytest.mark.no_emulated_pass("planning: no table op runs")

TWRW = "table_row_wise"
WORLD, NODE = 4, 2
ADAM = {"optimizer": EmbOptimType.ADAM}


def _topology(**kwargs) -> Topology:
    return Topology(world_size=WORLD, local_world_size=NODE, compute_device="cpu", **kwargs)


def _constraints(**user) -> dict:
    constraints = make_constraints()
    constraints["user"] = dataclasses.replace(constraints["user"], **user)
    return constraints


def _sharders() -> list:
    return [
        DynamicEmbeddingBagCollectionSharder(fused_params=ADAM),
        DynamicEmbeddingCollectionSharder(fused_params=ADAM),
    ]


def _plan(constraints) -> dict:
    planner = DynamicEmbeddingShardingPlanner(
        all_configs(), _topology(), constraints=constraints, debug=False
    )
    plan = planner.plan(Model(), _sharders())
    return {name: ps for module_plan in plan.plan.values() for name, ps in module_plan.items()}


def _options(constraints) -> list:
    return DynamicEmbeddingEnumerator(
        topology=_topology(), batch_size=128, constraints=constraints
    ).enumerate(Model(), _sharders())


def test_table_row_wise_constraint_puts_the_table_on_one_nodes_ranks():
    ps = _plan(_constraints(sharding_types=[TWRW]))["user"]
    assert isinstance(ps, DynamicEmbParameterSharding)
    assert (ps.sharding_type, ps.compute_kernel) == (TWRW, DYNAMIC_KERNEL)
    assert ps.ranks in ([0, 1], [2, 3]), ps.ranks
    assert [s.placement.rank() for s in ps.sharding_spec.shards] == ps.ranks
    # 1000 rows over the node's 2 ranks: 500 a rank -> 512 (bucket 128); the HBM
    # budget (1001 bytes) split over those 2 ranks.
    o = ps.dynamicemb_options
    assert (o.max_capacity, o.bucket_capacity, o.init_capacity) == (512, 128, 128)
    assert o.local_hbm_for_values == 501
    assert ps.dist_type == o.dist_type == "roundrobin"


def test_enumerator_costs_table_row_wise_beside_row_wise():
    options = _options(_constraints(sharding_types=[ROW_WISE, TWRW]))
    user = {so.sharding_type: so for so in options if so.name == "user"}
    assert set(user) == {ROW_WISE, TWRW}
    assert all(so.compute_kernel == DYNAMIC_KERNEL for so in user.values())
    config = next(c for c in all_configs() if c.name == "user")
    assert len(user[TWRW].shards) == NODE and len(user[ROW_WISE].shards) == WORLD
    # Adam: 8 + 16 state columns of float32; each rank of the node holds half the table.
    node_share = get_table_value_bytes(config, EmbOptimType.ADAM, NODE, 128) // NODE
    assert node_share == 512 * 24 * 4
    assert {(s.storage.hbm, s.storage.ddr) for s in user[TWRW].shards} == {(0, node_share)}
    world_share = get_table_value_bytes(config, EmbOptimType.ADAM, WORLD, 128) // WORLD
    assert {(s.storage.hbm, s.storage.ddr) for s in user[ROW_WISE].shards} == {(0, world_share)}
    # TorchRec's perf estimates for both (its TWRW one: intra- and cross-node comms).
    assert all(s.perf is not None and s.perf.total > 0 for so in user.values() for s in so.shards)


def test_planner_picks_among_the_listed_types_and_fills_options_for_its_pick():
    ps = _plan(_constraints(sharding_types=[ROW_WISE, TWRW]))["user"]
    assert ps.sharding_type in (ROW_WISE, TWRW)
    ranks = NODE if ps.sharding_type == TWRW else WORLD
    assert len(ps.ranks) == ranks
    assert ps.dynamicemb_options.max_capacity == {NODE: 512, WORLD: 256}[ranks]


def test_sequence_tables_are_refused_table_row_wise():
    constraints = make_constraints()
    constraints["query"] = dataclasses.replace(constraints["query"], sharding_types=[TWRW])
    with pytest.raises(ValueError, match=r"table 'query'.*table_row_wise.*EmbeddingConfig"):
        _plan(constraints)


def test_ordinary_tables_on_cpu_get_table_row_wise_only_when_constrained_to_it():
    offered = {so.sharding_type for so in _options(make_constraints()) if so.name == "country"}
    assert TWRW not in offered and offered
    constraints = make_constraints()
    constraints["country"] = ParameterConstraints(sharding_types=[TWRW])
    offered = {so.sharding_type for so in _options(constraints) if so.name == "country"}
    assert offered == {TWRW}


@pytest.mark.parametrize("node_size", [None, 0, 3])
def test_table_ranks_needs_a_node_size_dividing_the_world(node_size):
    with pytest.raises(ValueError, match=f"node_size must divide world_size=4, got {node_size}"):
        table_ranks(TWRW, 4, node_size)
