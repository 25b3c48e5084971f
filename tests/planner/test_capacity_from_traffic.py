"""Capacities sized from traffic (dynemb.planner.recommend_capacity and friends).

The oracle: a fresh sample of W-train's ids (benchmark/README.md: Zipf(1.05) over
1,000,000 ids a table, keys spread over 63 bits, one table's 4096 x 16 ids a step,
drawn by benchmark/train_workloads.py) replayed through a full-size ScoredHashTable
of the recommended capacity, counted here from its BatchStats. Its eviction (or hit)
rate must be within 20% of the target.
"""

import sys
from pathlib import Path

import pytest
import torch
from torchrec.modules.embedding_configs import EmbeddingBagConfig
from torchrec.modules.embedding_modules import EmbeddingBagCollection

from dynemb import DynamicEmbTableOptions, ScoredHashTable
from dynemb.planner import (
    DynamicEmbeddingShardingPlanner,
    DynamicEmbParameterConstraints,
    TrafficRates,
    configs_with_capacities,
    get_sharded_table_capacity,
    measure_traffic_rates,
    recommend_capacities,
    recommend_capacity,
)
from dynemb.shard import DynamicEmbeddingBagCollectionSharder
from dynemb.types import DynamicEmbScoreStrategy
from tests.support.planner_models import cpu_topology, entries

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmark"))
from train_workloads import Config, spread_ids, zipf_ids

pytestmark = pytest.mark.no_emulated_pass(
    "rates of a replay: the table ops it replays give the same bits on every executor "
    "(tests/csrc/test_executor_parity.py), so a second pass measures the same rates"
)

LFU = DynamicEmbScoreStrategy.LFU
TIMESTAMP = DynamicEmbScoreStrategy.TIMESTAMP
STEP = DynamicEmbScoreStrategy.STEP
DECAYED_LFU = DynamicEmbScoreStrategy.DECAYED_LFU
HALF_LIFE = 2  # steps: the sample's 12 batches are 6 half-lives
W_TRAIN = Config()
BATCHES = 12  # steps of one W-train table: 12 x 65,536 ids
TOLERANCE = 0.2


def w_train_sample(seed: int, batches: int = BATCHES) -> list[torch.Tensor]:
    """``batches`` steps of one W-train table's ids (keys spread over 63 bits)."""
    gen = torch.Generator().manual_seed(seed)
    per_step = W_TRAIN.batch * W_TRAIN.pooling_factor
    return [
        spread_ids(zipf_ids(per_step, W_TRAIN.num_ids, W_TRAIN.zipf_s, gen)) for _ in range(batches)
    ]


@pytest.fixture(scope="module")
def sample() -> list[torch.Tensor]:
    return w_train_sample(seed=0)


@pytest.fixture(scope="module")
def fresh() -> list[torch.Tensor]:
    return w_train_sample(seed=1)


def full_size_rates(
    batches, capacity: int, strategy, bucket_capacity=128, half_life=None
) -> tuple[float, float]:
    """(eviction rate, hit rate) of a full-size table: (evicted + failed) / ids, hits / ids."""
    table = ScoredHashTable(
        dim=1,
        capacity=capacity,
        bucket_capacity=bucket_capacity,
        score_strategy=strategy,
        score_half_life_steps=half_life,
    )
    full = hits = lookups = 0
    for batch in batches:
        table.find_or_insert(batch)
        stats = table.last_stats
        full += stats.evicted + stats.failed
        hits += stats.hits
        lookups += batch.numel()
    return full / lookups, hits / lookups


@pytest.mark.parametrize(
    ("strategy", "target"),
    [(LFU, 0.05), (LFU, 0.15), (TIMESTAMP, 0.05), (TIMESTAMP, 0.15), ((TIMESTAMP, LFU), 0.1)],
    ids=["lfu-0.05", "lfu-0.15", "timestamp-0.05", "timestamp-0.15", "timestamp_lfu-0.1"],
)
def test_recommended_capacity_meets_eviction_target(sample, fresh, strategy, target):
    rec = recommend_capacity(sample, target_eviction_rate=target, score_strategy=strategy)
    measured, _ = full_size_rates(fresh, rec.capacity, strategy)
    print(f"{strategy} target {target}: capacity {rec.capacity} (scale {rec.scale}), "
          f"estimated {rec.eviction_rate:.4f}, measured {measured:.4f}")  # fmt: skip
    assert rec.capacity % 128 == 0
    assert abs(measured - target) <= TOLERANCE * target


@pytest.mark.parametrize(
    "strategy", [DECAYED_LFU, (TIMESTAMP, DECAYED_LFU)], ids=["decayed_lfu", "timestamp_decayed"]
)
def test_recommended_capacity_meets_eviction_target_with_decay(sample, fresh, strategy):
    """DECAYED_LFU decays by the table's steps: the replay's and the full table's
    steps are the sample's batches, so the half-life means the same in both."""
    rec = recommend_capacity(
        sample, target_eviction_rate=0.1, score_strategy=strategy, score_half_life_steps=HALF_LIFE
    )
    measured, _ = full_size_rates(fresh, rec.capacity, strategy, half_life=HALF_LIFE)
    print(f"{strategy} half-life {HALF_LIFE} target 0.1: capacity {rec.capacity} "
          f"(scale {rec.scale}), estimated {rec.eviction_rate:.4f}, measured {measured:.4f}")  # fmt: skip
    assert abs(measured - 0.1) <= TOLERANCE * 0.1
    # The half-life reaches the replayed table: without decay (LFU) the capacity differs.
    lfu = measure_traffic_rates(sample, rec.capacity, LFU, scale=rec.scale)
    decayed = measure_traffic_rates(
        sample, rec.capacity, strategy, scale=rec.scale, score_half_life_steps=HALF_LIFE
    )
    assert decayed == rec and lfu.eviction_rate != decayed.eviction_rate


def test_recommended_capacity_meets_hit_target(sample, fresh):
    rec = recommend_capacity(sample, target_hit_rate=0.8, score_strategy=STEP)
    _, measured = full_size_rates(fresh, rec.capacity, STEP)
    print(f"STEP hit target 0.8: capacity {rec.capacity}, measured {measured:.4f}")
    assert abs(measured - 0.8) <= TOLERANCE * 0.8
    assert rec.hit_rate >= 0.8


def test_capacity_is_the_smallest_that_meets_the_target(sample):
    rec = recommend_capacity(sample, target_eviction_rate=0.1, score_strategy=LFU, scale=8)
    step = rec.scale * 128
    smaller = measure_traffic_rates(sample, rec.capacity - step, LFU, scale=rec.scale)
    assert rec.eviction_rate <= 0.1 < smaller.eviction_rate


def test_scaled_replay_estimates_the_full_table(sample):
    full = measure_traffic_rates(sample, 64 * 1024, TIMESTAMP)
    scaled = measure_traffic_rates(sample, 64 * 1024, TIMESTAMP, scale=16)
    assert (full.scale, scaled.scale, full.lookups) == (1, 16, scaled.lookups)
    assert scaled.eviction_rate == pytest.approx(full.eviction_rate, rel=0.05)
    assert scaled.hit_rate == pytest.approx(full.hit_rate, rel=0.05)


def test_warmup_batches_are_replayed_but_not_counted(sample):
    rates = measure_traffic_rates(sample, 64 * 1024, LFU, scale=4, warmup_batches=8)
    assert rates.lookups == sum(b.numel() for b in sample[8:])
    cold = measure_traffic_rates(sample, 64 * 1024, LFU, scale=4)
    assert rates.eviction_rate > cold.eviction_rate  # the table is full after the warm-up


def test_trace_file_is_a_saved_list_of_batches(sample, tmp_path):
    path = tmp_path / "ids.pt"
    torch.save(sample[:4], path)
    from_file = measure_traffic_rates(path, 16 * 1024, LFU, scale=4)
    assert from_file == measure_traffic_rates(sample[:4], 16 * 1024, LFU, scale=4)


def test_planner_uses_recommended_capacities(sample):
    configs = [
        EmbeddingBagConfig(name="user", embedding_dim=8, num_embeddings=10, feature_names=["u"]),
        EmbeddingBagConfig(name="item", embedding_dim=8, num_embeddings=10, feature_names=["i"]),
    ]
    options = DynamicEmbTableOptions(score_strategy=LFU, bucket_capacity=64)
    constraints = {
        name: DynamicEmbParameterConstraints(use_dynamicemb=True, dynamicemb_options=options)
        for name in ("user", "item")
    }
    rates = recommend_capacities(
        {"user": sample[:4], "item": sample[4:8]},
        constraints,
        target_eviction_rate={"user": 0.1, "item": 0.2},
        scale=4,
    )
    assert all(isinstance(r, TrafficRates) for r in rates.values())
    assert rates["user"].capacity > rates["item"].capacity
    assert rates["user"].capacity % 64 == 0  # the constraints' bucket width
    sized = configs_with_capacities(configs, rates)
    assert [c.num_embeddings for c in sized] == [rates["user"].capacity, rates["item"].capacity]
    assert [c.num_embeddings for c in configs] == [10, 10]  # copies
    planner = DynamicEmbeddingShardingPlanner(
        sized, topology=cpu_topology(2), constraints=constraints, debug=False
    )
    ebc = EmbeddingBagCollection(tables=sized, device=torch.device("meta"))
    plan = entries(planner.plan(ebc, [DynamicEmbeddingBagCollectionSharder()]))
    for config in sized:
        got = plan[config.name].dynamicemb_options.max_capacity
        assert got == get_sharded_table_capacity(config, 2, 64)
        assert 2 * got >= config.num_embeddings


def test_planner_sizes_decayed_lfu_tables_with_their_half_life(sample):
    options = DynamicEmbTableOptions(
        score_strategy=DECAYED_LFU, score_half_life_steps=HALF_LIFE, bucket_capacity=64
    )
    constraints = {
        "t": DynamicEmbParameterConstraints(use_dynamicemb=True, dynamicemb_options=options)
    }
    got = recommend_capacities({"t": sample[:6]}, constraints, target_eviction_rate=0.1, scale=4)
    want = recommend_capacity(
        sample[:6], target_eviction_rate=0.1, score_strategy=DECAYED_LFU, bucket_capacity=64,
        scale=4, score_half_life_steps=HALF_LIFE,
    )  # fmt: skip
    assert got["t"] == want


# ---------------------------------------------------------------- argument checks

IDS = [torch.arange(1000, dtype=torch.int64)]


@pytest.mark.parametrize("bad", [0, 1, 1.5, -0.1, "0.1", True, float("nan")])
def test_bad_target_names_argument_and_value(bad):
    with pytest.raises(ValueError, match=rf"target_eviction_rate must be a number in \(0, 1\), got {bad!r}"):  # fmt: skip
        recommend_capacity(IDS, target_eviction_rate=bad)
    with pytest.raises(ValueError, match=r"target_hit_rate must be a number in \(0, 1\)"):
        recommend_capacity(IDS, target_hit_rate=bad)


def test_exactly_one_target():
    with pytest.raises(ValueError, match="exactly one of target_eviction_rate and target_hit_rate"):
        recommend_capacity(IDS)
    with pytest.raises(ValueError, match="exactly one of"):
        recommend_capacity(IDS, target_eviction_rate=0.1, target_hit_rate=0.9)


@pytest.mark.parametrize(
    "empty", [[], [torch.empty(0, dtype=torch.int64)]], ids=["no_batch", "no_id"]
)
def test_empty_sample(empty):
    with pytest.raises(ValueError, match=r"sample is empty \(\d batches, 0 ids\)"):
        recommend_capacity(empty, target_eviction_rate=0.1)


def test_wrong_dtype_and_shape():
    ids32 = [IDS[0], IDS[0].to(torch.int32)]
    with pytest.raises(TypeError, match=r"sample\[1\] must have dtype torch.int64 \(ids\), got torch.int32"):  # fmt: skip
        recommend_capacity(ids32, target_eviction_rate=0.1)
    with pytest.raises(ValueError, match=r"sample\[0\] must be 1-D .* got shape \(10, 100\)"):
        recommend_capacity([IDS[0].view(10, 100)], target_eviction_rate=0.1)
    with pytest.raises(TypeError, match="sample must be a list of 1-D int64 id tensors .* got Tensor"):  # fmt: skip
        recommend_capacity(IDS[0], target_eviction_rate=0.1)


def test_strategy_that_cannot_be_replayed():
    for strategy in (DynamicEmbScoreStrategy.CUSTOMIZED, DynamicEmbScoreStrategy.NO_EVICTION):
        with pytest.raises(ValueError, match=f"score_strategy must be TIMESTAMP, STEP, LFU, DECAYED_LFU or .* got {strategy!r}"):  # fmt: skip
            recommend_capacity(IDS, target_eviction_rate=0.1, score_strategy=strategy)


def test_half_life_only_with_decayed_lfu():
    with pytest.raises(ValueError, match="score_half_life_steps"):
        recommend_capacity(IDS, target_eviction_rate=0.1, score_strategy=DECAYED_LFU)
    with pytest.raises(ValueError, match="score_half_life_steps"):
        measure_traffic_rates(IDS, 1024, LFU, score_half_life_steps=4)
    with pytest.raises(ValueError, match="score_half_life_steps"):
        measure_traffic_rates(IDS, 1024, DECAYED_LFU, score_half_life_steps=0)


def test_unreachable_hit_rate():
    # 1000 distinct ids seen once each: every lookup is a first sight.
    with pytest.raises(ValueError, match=r"target_hit_rate=0.5 is out of the sample's reach"):
        recommend_capacity(IDS, target_hit_rate=0.5)


def test_bad_sizes_and_table_names():
    with pytest.raises(ValueError, match="capacity must be a multiple of scale \\* bucket_capacity = 512, got 1000"):  # fmt: skip
        measure_traffic_rates(IDS, 1000, scale=4)
    with pytest.raises(ValueError, match="bucket_capacity must be a multiple of 16, got 24"):
        recommend_capacity(IDS, target_eviction_rate=0.1, bucket_capacity=24)
    with pytest.raises(ValueError, match="warmup_batches=1 leaves no id to count"):
        measure_traffic_rates(IDS, 128, warmup_batches=1)
    with pytest.raises(ValueError, match=r"table 'user': target_eviction_rate must be"):
        recommend_capacities({"user": IDS}, target_eviction_rate=2.0)
    with pytest.raises(ValueError, match=r"target_hit_rate has no entry for table 'user'"):
        recommend_capacities({"user": IDS}, target_hit_rate={"item": 0.5})
    config = EmbeddingBagConfig(name="user", embedding_dim=8, num_embeddings=10, feature_names=["u"])  # fmt: skip
    with pytest.raises(ValueError, match=r"capacities name tables \['item'\]"):
        configs_with_capacities([config], {"item": 128})
    with pytest.raises(ValueError, match=r"capacities\['user'\] must be a positive int, got 0"):
        configs_with_capacities([config], {"user": 0})
