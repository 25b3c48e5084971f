"""Mixed models with Adam on CPU: the planner's ``ordinary_tables_as_dynamic`` holds an
ordinary TorchRec table as a dynamic one that keeps an ordinary table's meaning (real
gloo ranks, checked against torch.optim.Adam on the unsharded table)."""

import pytest
import torch
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig
from torchrec.distributed.planner import ParameterConstraints, Topology
from torchrec.distributed.types import ParameterSharding

from dynemb.optimizer import EmbOptimType
from dynemb.planner import DynamicEmbeddingShardingPlanner
from dynemb.shard import DynamicEmbeddingBagCollectionSharder
from dynemb.shard.sharders import check_cpu_optimizer
from dynemb.types import DynamicEmbScoreStrategy
from tests.support.multiprocess import run_ranks
from tests.support.ordinary_tables_workers import (
    ROWS,
    adam_without_the_switch_is_a_clear_error,
    ordinary_table_checkpoint_loads,
    ordinary_table_checkpoint_round_trip,
    ordinary_table_in_ec_trains_like_torch_adam,
    ordinary_table_trains_like_torch_adam,
    out_of_range_ids_are_rejected,
    rows_of_a_cpu_module_follow_init_fn_as_torchrec,
    state_dict_holds_the_rows_as_torchrec,
)

TIMEOUT = 120.0


@pytest.mark.parametrize("world_size", [1, 2])
def test_ordinary_table_trains_like_torch_adam(world_size):
    run_ranks(ordinary_table_trains_like_torch_adam, world_size, timeout=TIMEOUT)


@pytest.mark.no_emulated_pass("spawned rank: init_fn rows are written by Python")
def test_rows_of_a_cpu_module_follow_init_fn_as_torchrec():
    run_ranks(rows_of_a_cpu_module_follow_init_fn_as_torchrec, 1, timeout=TIMEOUT)


def test_ordinary_table_in_ec_trains_like_torch_adam():
    run_ranks(ordinary_table_in_ec_trains_like_torch_adam, 2, timeout=TIMEOUT)


@pytest.mark.no_emulated_pass(
    "spawned ranks: checkpoint files and resharding; training runs on the executor in the Adam tests"
)
def test_checkpoint_round_trip_and_other_world_sizes(tmp_path):
    saved = run_ranks(ordinary_table_checkpoint_round_trip, 2, str(tmp_path), timeout=TIMEOUT)[0]
    for world_size in (1, 3):  # the rows go to their owners under the new blocks
        for weight in run_ranks(
            ordinary_table_checkpoint_loads, world_size, str(tmp_path), timeout=TIMEOUT
        ):
            torch.testing.assert_close(weight, saved, atol=0, rtol=0)


@pytest.mark.no_emulated_pass("spawned ranks: state_dict layout, Python only")
def test_state_dict_holds_the_rows_as_torchrec():
    run_ranks(state_dict_holds_the_rows_as_torchrec, 2, timeout=TIMEOUT)


@pytest.mark.no_emulated_pass("spawned ranks: the id check runs before any table op")
def test_out_of_range_ids_are_rejected():
    bad_ids = [ROWS, -1, 1 << 40]
    for messages in run_ranks(out_of_range_ids_are_rejected, 2, bad_ids, timeout=TIMEOUT):
        for bad_id, message in zip(bad_ids, messages, strict=True):
            assert "'country'" in message and f"id {bad_id} " in message, message
            assert f"[0, {ROWS})" in message and "feature 'c'" in message, message


@pytest.mark.no_emulated_pass("spawned ranks: an error raised at sharding, before any table op")
def test_adam_without_the_switch_names_the_table_and_the_switch():
    for message in run_ranks(adam_without_the_switch_is_a_clear_error, 2, timeout=TIMEOUT):
        assert "['country']" in message and "ADAM" in message, message
        assert "ordinary_tables_as_dynamic=True" in message, message


def _plan(constraints=None, **kwargs):
    configs = [
        EmbeddingBagConfig(name="country", embedding_dim=8, num_embeddings=1000, feature_names=["c"]),
        EmbeddingBagConfig(name="city", embedding_dim=8, num_embeddings=10, feature_names=["y"],
                           weight_init_min=-0.5, weight_init_max=0.25),
    ]  # fmt: skip
    planner = DynamicEmbeddingShardingPlanner(
        configs,
        topology=Topology(world_size=3, compute_device="cpu"),
        constraints=constraints,
        ordinary_tables_as_dynamic=True,
        **kwargs,
    )
    ebc = EmbeddingBagCollection(tables=configs, device=torch.device("meta"))
    return planner.plan(ebc, [DynamicEmbeddingBagCollectionSharder()]).plan[""]


def test_plan_entries_of_ordinary_tables():
    plan = _plan({"country": ParameterConstraints(pooling_factors=[3.0])})
    for name in ("country", "city"):
        entry = plan[name]
        options = entry.dynamicemb_options
        assert entry.ordinary_table and entry.sharding_type == "row_wise"
        assert options.dist_type == "continuous"
        assert options.score_strategy == DynamicEmbScoreStrategy.NO_EVICTION
        rows = -(-{"country": 1000, "city": 10}[name] // 3)
        assert options.init_capacity * 3 >= rows * 4  # at most 3/4 full after the fill
        assert options.max_capacity == 2 * options.init_capacity
    city = plan["city"].dynamicemb_options.initializer_args
    assert (city.lower, city.upper) == (-0.5, 0.25)  # the config's weight_init_min / max


def test_conflicting_constraints_name_the_table():
    with pytest.raises(ValueError, match=r"table 'city'.*sharding_types=\['table_wise'\]"):
        _plan({"city": ParameterConstraints(sharding_types=["table_wise"])})


@pytest.mark.parametrize(
    ("optimizer", "kernel", "device", "refused"),
    [
        (EmbOptimType.ADAM, "fused", "cpu", True),
        (EmbOptimType.ADAM, "fused", None, True),  # DMP's default device: cpu
        (EmbOptimType.ADAM, "dense", "cpu", False),  # torch autograd, any optimizer
        (EmbOptimType.ADAM, "customized_kernel", "cpu", False),  # dynemb's kernel
        (EmbOptimType.ADAM, "fused", "meta", False),  # not fbgemm's CPU kernel
        (EmbOptimType.EXACT_ROWWISE_ADAGRAD, "fused", "cpu", False),
    ],
)
def test_cpu_optimizer_check(optimizer, kernel, device, refused):
    params = {"t": ParameterSharding(sharding_type="row_wise", compute_kernel=kernel, ranks=[0])}
    device = torch.device(device) if device else None
    if refused:
        with pytest.raises(ValueError, match=r"\['t'\].*ADAM.*ordinary_tables_as_dynamic=True"):
            check_cpu_optimizer({"optimizer": optimizer}, params, device)
    else:
        check_cpu_optimizer({"optimizer": optimizer}, params, device)
