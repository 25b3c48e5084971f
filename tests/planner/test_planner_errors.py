"""DynamicEmbeddingShardingPlanner errors: each names the table and the offending value."""

import copy

import pytest
import torch
from torchrec.distributed.planner import ParameterConstraints
from torchrec.modules.embedding_configs import EmbeddingBagConfig

from dynemb import DynamicEmbInitializerArgs, DynamicEmbInitializerMode, DynamicEmbTableOptions
from dynemb.planner import DynamicEmbeddingShardingPlanner, DynamicEmbParameterConstraints
from tests.support.planner_models import Model, all_configs, bag_configs, cpu_topology, sharders

pytestmark = pytest.mark.no_emulated_pass("planning: no table op runs")


def dynamic(**options) -> DynamicEmbParameterConstraints:
    return DynamicEmbParameterConstraints(
        use_dynamicemb=True, dynamicemb_options=DynamicEmbTableOptions(**options)
    )


def make_planner(constraints, configs=None):
    return DynamicEmbeddingShardingPlanner(
        all_configs() if configs is None else configs,
        topology=cpu_topology(2),
        constraints=constraints,
        debug=False,
    )


@pytest.mark.parametrize(
    "constraint, match",
    [
        (
            DynamicEmbParameterConstraints(use_dynamicemb=True, sharding_types=["data_parallel"]),
            r"table 'user': a dynamic table is sharded one of "
            r"\['row_wise', 'table_wise', 'column_wise', 'table_row_wise'\].*"
            r"\['data_parallel'\] unsupported",
        ),
        (
            DynamicEmbParameterConstraints(
                use_dynamicemb=True, sharding_types=["row_wise", "table_column_wise"]
            ),
            r"table 'user': .*\['table_column_wise'\] unsupported",
        ),
        (
            DynamicEmbParameterConstraints(use_dynamicemb=True, compute_kernels=["fused"]),
            r"table 'user': a dynamic table uses compute kernel 'customized_kernel' only.*fused",
        ),
        (
            ParameterConstraints(compute_kernels=["customized_kernel"]),
            r"table 'user': compute kernel 'customized_kernel' is for dynamic tables",
        ),
        (
            DynamicEmbParameterConstraints(
                use_dynamicemb=False, compute_kernels=["customized_kernel"]
            ),
            r"table 'user': compute kernel 'customized_kernel' is for dynamic tables",
        ),
        (dynamic(dim=16), r"table 'user': dynamicemb_options.dim=16 disagrees.*embedding_dim=8"),
        (dynamic(bucket_capacity=20), r"table 'user': .*bucket_capacity.*multiple of 16.*got 20"),
        (
            dynamic(bucket_capacity=2056),
            r"table 'user': .*bucket_capacity.*multiple of 16.*got 2056",
        ),
        (dynamic(bucket_capacity=0), r"table 'user': .*bucket_capacity.*got 0"),
        (dynamic(init_capacity=0), r"table 'user': .*init_capacity must be >= 1, got 0"),
        (dynamic(init_capacity=2.5), r"table 'user': .*init_capacity must be an int"),
        (dynamic(global_hbm_for_values=-1), r"table 'user': .*global_hbm_for_values.*got -1"),
        (dynamic(index_type=torch.int32), r"table 'user': .*index_type.*torch.int32"),
        (dynamic(embedding_dtype=torch.float64), r"table 'user': .*embedding_dtype.*float64"),
        (
            dynamic(
                initializer_args=DynamicEmbInitializerArgs(
                    mode=DynamicEmbInitializerMode.NORMAL, std_dev=0.0
                )
            ),
            r"table 'user': dynamicemb_options.initializer_args: .*std_dev must be > 0",
        ),
        (
            dynamic(eval_initializer_args=DynamicEmbInitializerArgs(lower=1.0, upper=0.0)),
            r"table 'user': dynamicemb_options.eval_initializer_args: .*lower < upper",
        ),
        (
            # The default lower bound, -sqrt(1 / 1000), is above the user's upper bound.
            dynamic(initializer_args=DynamicEmbInitializerArgs(upper=-1.0)),
            r"table 'user': dynamicemb_options.initializer_args: .*lower < upper",
        ),
    ],
)
def test_bad_constraint_raises_value_error_naming_the_table(constraint, match):
    constraints = {"user": constraint}
    before = copy.deepcopy(constraints)
    with pytest.raises(ValueError, match=match):
        make_planner(constraints)
    assert constraints == before


def test_constraint_for_unknown_table_raises():
    with pytest.raises(ValueError, match=r"table 'nope', which is not in eb_configs"):
        make_planner({"nope": dynamic()})


def test_duplicate_table_names_raise():
    with pytest.raises(ValueError, match=r"eb_configs name table 'user' twice"):
        make_planner({}, configs=all_configs() + bag_configs()[:1])


def test_non_config_raises_type_error():
    with pytest.raises(TypeError, match="eb_configs must hold EmbeddingBagConfig"):
        make_planner({}, configs=[{"name": "user"}])


def test_non_constraint_raises_type_error():
    with pytest.raises(TypeError, match=r"table 'user': constraints must be ParameterConstraints"):
        make_planner({"user": {"use_dynamicemb": True}})


def test_non_options_raise_type_error():
    constraint = DynamicEmbParameterConstraints(use_dynamicemb=True, dynamicemb_options={"dim": 8})
    with pytest.raises(TypeError, match=r"table 'user': dynamicemb_options must be"):
        make_planner({"user": constraint})


def test_module_that_disagrees_with_eb_configs_raises_at_plan():
    # The planner was told "user" has 1000 rows; the module's table has 2000.
    configs = all_configs()
    planner = make_planner({"user": dynamic()}, configs=configs)
    bags = bag_configs()
    bags[0] = EmbeddingBagConfig(
        name="user", embedding_dim=8, num_embeddings=2000, feature_names=["u"]
    )
    with pytest.raises(ValueError, match=r"table 'user': the module's parameter \(2000 rows"):
        planner.plan(Model(bags=bags), sharders())
