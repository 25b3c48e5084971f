"""The planner and enumerator with table-wise dynamic tables: constraints honoured, the
whole table's capacity and memory on one rank, both types offered and costed when asked."""

import dataclasses

import pytest
from torchrec.distributed.planner import Topology

from dynemb.optimizer import EmbOptimType
from dynemb.planner import (
    DynamicEmbeddingEnumerator,
    DynamicEmbeddingShardingPlanner,
    DynamicEmbParameterSharding,
    get_table_value_bytes,
)
from dynemb.shard import DynamicEmbeddingBagCollectionSharder, DynamicEmbeddingCollectionSharder
from tests.support.planner_models import (
    DYNAMIC_KERNEL,
    ROW_WISE,
    Model,
    all_configs,
    make_constraints,
)

pytestmark = pytest.mark.no_emulated_pass("planning: no table op runs")

TABLE_WISE = "table_wise"
WORLD = 4
ADAM = {"optimizer": EmbOptimType.ADAM}


def _constraints(**user) -> dict:
    constraints = make_constraints()
    constraints["user"] = dataclasses.replace(constraints["user"], **user)
    # The sequence (EC) table, table-wise.
    constraints["query"] = dataclasses.replace(constraints["query"], sharding_types=[TABLE_WISE])
    return constraints


def _sharders() -> list:
    return [
        DynamicEmbeddingBagCollectionSharder(fused_params=ADAM),
        DynamicEmbeddingCollectionSharder(fused_params=ADAM),
    ]


def _plan(constraints, topology=None):
    planner = DynamicEmbeddingShardingPlanner(
        all_configs(),
        topology or Topology(world_size=WORLD, compute_device="cpu"),
        constraints=constraints,
        debug=False,
    )
    plan = planner.plan(Model(), _sharders())
    return {name: ps for module_plan in plan.plan.values() for name, ps in module_plan.items()}


def test_table_wise_constraint_gives_one_rank_the_whole_table():
    entries = _plan(_constraints(sharding_types=[TABLE_WISE]))
    for name in ("user", "query"):
        ps = entries[name]
        assert isinstance(ps, DynamicEmbParameterSharding), name
        assert (ps.sharding_type, ps.compute_kernel) == (TABLE_WISE, DYNAMIC_KERNEL), name
        assert len(ps.ranks) == 1 and len(ps.sharding_spec.shards) == 1, name
    user = entries["user"].dynamicemb_options
    # 1000 rows on one rank: 1024 (bucket 128); the whole HBM budget is that rank's.
    assert (user.max_capacity, user.bucket_capacity, user.init_capacity) == (1024, 128, 128)
    assert user.local_hbm_for_values == 1001
    row_wise = _plan(make_constraints())["user"].dynamicemb_options
    assert row_wise.max_capacity == 256 and row_wise.local_hbm_for_values == 251
    # Unconstrained dynamic tables stay row-wise over every rank.
    assert entries["item"].sharding_type == ROW_WISE and len(entries["item"].ranks) == WORLD


def test_enumerator_offers_both_types_with_their_storage():
    options = DynamicEmbeddingEnumerator(
        topology=Topology(world_size=WORLD, compute_device="cpu"),
        batch_size=128,
        constraints=_constraints(sharding_types=[ROW_WISE, TABLE_WISE]),
    ).enumerate(Model(), _sharders())
    user = {so.sharding_type: so for so in options if so.name == "user"}
    assert set(user) == {ROW_WISE, TABLE_WISE}
    assert all(so.compute_kernel == DYNAMIC_KERNEL for so in user.values())
    config = next(c for c in all_configs() if c.name == "user")
    # Adam: 8 + 16 state columns of float32 per row.
    whole = get_table_value_bytes(config, EmbOptimType.ADAM, 1, 128)
    assert whole == 1024 * 24 * 4
    (tw_shard,) = user[TABLE_WISE].shards
    assert (tw_shard.storage.hbm, tw_shard.storage.ddr) == (0, whole)
    assert len(user[ROW_WISE].shards) == WORLD
    per_rank = get_table_value_bytes(config, EmbOptimType.ADAM, WORLD, 128) // WORLD
    assert {(s.storage.hbm, s.storage.ddr) for s in user[ROW_WISE].shards} == {(0, per_rank)}
    # Both carry TorchRec's perf estimates (the proposers pick by them).
    assert all(s.perf is not None and s.perf.total > 0 for so in user.values() for s in so.shards)


def test_planner_picks_among_the_listed_types_and_fills_options_for_its_pick():
    entries = _plan(_constraints(sharding_types=[ROW_WISE, TABLE_WISE]))
    ps = entries["user"]
    assert ps.sharding_type in (ROW_WISE, TABLE_WISE)
    ranks = 1 if ps.sharding_type == TABLE_WISE else WORLD
    assert len(ps.ranks) == ranks
    assert ps.dynamicemb_options.max_capacity == {1: 1024, WORLD: 256}[ranks]


def test_table_wise_table_too_large_for_any_rank_fails_planning():
    from torchrec.distributed.planner.types import PlannerError

    topology = Topology(world_size=WORLD, compute_device="cpu", ddr_cap=50_000)
    with pytest.raises(PlannerError):
        _plan(_constraints(sharding_types=[TABLE_WISE]), topology)


def test_column_wise_constraint_gives_each_slice_every_row():
    constraints = _constraints(sharding_types=["column_wise"])
    options = DynamicEmbeddingEnumerator(
        topology=Topology(world_size=WORLD, compute_device="cpu"),
        batch_size=128,
        constraints=constraints,
    ).enumerate(Model(), _sharders())
    (user,) = [so for so in options if so.name == "user"]
    assert (user.sharding_type, user.compute_kernel) == ("column_wise", DYNAMIC_KERNEL)
    config = next(c for c in all_configs() if c.name == "user")
    for shard in user.shards:  # every row (1024 slots) at the shard's width, Adam's state too
        assert shard.storage.ddr == 1024 * 3 * shard.size[1] * 4
    assert sum(s.size[1] for s in user.shards) == config.embedding_dim
    ps = _plan(constraints)["user"]
    assert ps.sharding_type == "column_wise"
    assert ps.dynamicemb_options.max_capacity == 1024  # sliced by columns at build time


def test_sequence_tables_are_offered_column_wise():
    """An EmbeddingCollection's dynamic table slices by columns as a pooled one does."""
    constraints = make_constraints()
    constraints["query"] = dataclasses.replace(constraints["query"], sharding_types=["column_wise"])
    ps = _plan(constraints)["query"]
    assert (ps.sharding_type, ps.compute_kernel) == ("column_wise", DYNAMIC_KERNEL)
    assert isinstance(ps, DynamicEmbParameterSharding)
    widths = [shard.shard_sizes[1] for shard in ps.sharding_spec.shards]
    config = next(c for c in all_configs() if c.name == "query")
    assert sum(widths) == config.embedding_dim  # (dim 8: one slice, TorchRec's smallest width)
