"""Hot keys copied to every rank (``hot_replicas``): a sharded EBC / EC trained with
them on real gloo ranks equals the same model trained without, step by step, with
promotions and demotions; every replica holds its owner's bits."""

import pytest
import torch
from torchrec.distributed.embedding_sharding import EmbeddingShardingInfo
from torchrec.modules.embedding_configs import EmbeddingTableConfig

from dynemb import DynamicEmbTableOptions
from dynemb.distributed.sharding_names import DYNAMIC_KERNEL_NAME
from dynemb.planner import DynamicEmbParameterSharding
from dynemb.shard.rw_sharding import check_sharding_type
from tests.support.hot_keys_workers import (
    STEPS,
    HotCase,
    checkpoint_round_trip,
    deltas_and_warm_start,
    train_both,
)
from tests.support.multiprocess import run_ranks

OPTIMIZERS = ["EXACT_SGD", "EXACT_ADAGRAD", "EXACT_ROWWISE_ADAGRAD", "ADAM", "FTRL"]
RTOL = ATOL = 1e-5

# The hot-key path is torch ops over the tables' kernels: 2 ranks cover the emulated
# executor; 4 ranks add only the collective pattern, which no executor changes.
_FOUR_RANKS_ON_CPU_ONLY = "4 ranks run on the CPU executor; 2 ranks cover the emulated one"
# Dumps, loads, deltas and warm starts of a model with replicas are Python over the
# same table ops as training, which the 2-rank cases above run on the emulated executor.
_PYTHON_OVER_TRAINED_TABLES = "dumps, deltas and warm starts: Python over the ops of training"


def _check(cases, results):
    world_size = len(results)
    for c, case in enumerate(cases):
        moved = 0
        for rank in range(world_size):
            r = results[rank][c]
            for step in range(STEPS):
                got, want = r["hot"][step], r["plain"][step]
                for g, w in zip(got, want) if case.pooling == "NONE" else [(got, want)]:
                    torch.testing.assert_close(
                        g, w, rtol=RTOL, atol=ATOL,
                        msg=lambda m, s=step, r=rank, c=case: f"{c} rank {r} step {s}: {m}",
                    )  # fmt: skip
            for name, (keys, rows, scores) in r["plain_entries"].items():
                hot_keys, hot_rows, hot_scores = r["hot_entries"][name]
                assert torch.equal(keys, hot_keys), f"{case} {name}: other keys stored"
                torch.testing.assert_close(hot_rows, rows, rtol=RTOL, atol=ATOL)
                if case.score == "LFU":  # the owner counts the accesses of every rank
                    assert torch.equal(hot_scores, scores), f"{case} {name}: LFU scores"
            # one table to the outside: telemetry names it once, an incremental dump of
            # every rank holds each key once, with the row of training without replicas
            assert r["hot_tables"] == r["plain_tables"], case
            assert r["hot_dump"].keys() == r["plain_dump"].keys(), case
            dumped = [(c, n, e) for c, t in r["plain_dump"].items() for n, e in t.items()]
            assert dumped, case
            for collection, name, (keys, rows) in dumped:
                hot_keys, hot_rows = r["hot_dump"][collection][name]
                order, hot_order = torch.argsort(keys), torch.argsort(hot_keys)
                assert torch.equal(keys[order], hot_keys[hot_order]), f"{case} {name}: dump"
                torch.testing.assert_close(hot_rows[hot_order], rows[order], rtol=RTOL, atol=ATOL)
            stats = r["stats"]
            assert stats["local_ids"] > 0 and stats["sent_ids"] > 0, (case, stats)
            moved += stats["demoted"]
            # each replica holds its owner's whole rows, bit for bit
            for name, (keys, replica) in r["replicas"].items():
                for owner in range(world_size):
                    owned_keys, owned_rows, _ = results[owner][c]["hot_entries"][name]
                    hit = torch.isin(keys, owned_keys)
                    at = torch.searchsorted(owned_keys, keys[hit])
                    assert torch.equal(replica[hit], owned_rows[at]), f"{case} {name} replica"
                assert torch.equal(keys, results[0][c]["replicas"][name][0])
        assert moved > 0, f"{case}: no hot key was demoted"
        if case.score in ("LFU", "DECAYED_LFU"):  # the hot set: top K by the owners' scores
            for name in results[0][c]["chosen"]:
                entries = [results[rank][c]["hot_entries"][name] for rank in range(world_size)]
                keys = torch.cat([e[0] for e in entries])
                scores = torch.cat([e[2] for e in entries])
                # ascending key, then descending score (stable): ties to the smaller key
                order = torch.argsort(keys)
                keys, scores = keys[order], scores[order]
                best = keys[torch.sort(scores, descending=True, stable=True).indices[: case.k]]
                for rank in range(world_size):
                    got = results[rank][c]["chosen"][name]
                    assert torch.equal(got, best.sort()[0]), f"{case} {name} rank {rank}: hot set"


def _ebc_cases(world_size: int):
    # every optimizer on 2 ranks; 4 ranks add only the collective pattern, so one
    # optimizer per pooling covers them
    optimizers = OPTIMIZERS if world_size == 2 else OPTIMIZERS[2:3]
    cases = [HotCase(opt, "SUM") for opt in optimizers]
    cases += [HotCase(opt, "MEAN", "hash_roundrobin") for opt in optimizers]
    cases += [HotCase("EXACT_ROWWISE_ADAGRAD", "SUM", "continuous", weighted=True, score="LFU")]
    cases += [HotCase("ADAM", "SUM", score="DECAYED_LFU")]
    return cases


@pytest.mark.parametrize(
    "world_size",
    [2, pytest.param(4, marks=pytest.mark.no_emulated_pass(_FOUR_RANKS_ON_CPU_ONLY))],
)
def test_hot_keys_ebc_equals_unreplicated(world_size):
    cases = _ebc_cases(world_size)
    _check(cases, run_ranks(train_both, world_size, cases))


@pytest.mark.parametrize(
    "world_size",
    [2, pytest.param(4, marks=pytest.mark.no_emulated_pass(_FOUR_RANKS_ON_CPU_ONLY))],
)
def test_hot_keys_ec_equals_unreplicated(world_size):
    optimizers = OPTIMIZERS if world_size == 2 else OPTIMIZERS[3:4]
    cases = [HotCase(opt, "NONE") for opt in optimizers]
    # use_index_dedup sends each distinct id once, its count as its weight: LFU scores
    # of hot keys count their accesses as without replicas
    cases += [HotCase("ADAM", "NONE", dedup=True, score="LFU")]
    _check(cases, run_ranks(train_both, world_size, cases))


@pytest.mark.parametrize(
    "field, value", [("hot_replicas", -1), ("hot_refresh_steps", 0), ("hot_replicas", 1.5)]
)
def test_hot_options_checked(field, value):
    with pytest.raises(ValueError, match=f"{field} must be an int"):
        DynamicEmbTableOptions(**{field: value})


@pytest.mark.no_emulated_pass(_PYTHON_OVER_TRAINED_TABLES)
def test_checkpoint_round_trip_with_and_without_replicas(tmp_path):
    """A dump of a model with hot replicas loads into one without and the other way
    round (then reload_hot_replicas), both training on as the model never dumped."""
    case = HotCase("EXACT_ROWWISE_ADAGRAD", "SUM")
    results = run_ranks(checkpoint_round_trip, 2, case, str(tmp_path))
    for rank, r in enumerate(results):
        for name in ("from_hot", "into_hot_reload_True"):
            for step, (got, want) in enumerate(zip(r[name], r["reference"])):
                torch.testing.assert_close(
                    got, want, rtol=RTOL, atol=ATOL,
                    msg=lambda m, n=name, s=step, k=rank: f"{n} rank {k} step {s}: {m}",
                )  # fmt: skip
    # without the reload the replicas hold the rows trained before the load
    stale = results[0]["into_hot_reload_False"]
    assert any(not torch.allclose(g, w) for g, w in zip(stale, results[0]["reference"]))


@pytest.mark.no_emulated_pass(_PYTHON_OVER_TRAINED_TABLES)
def test_deltas_and_warm_start_see_one_table(tmp_path):
    """The deltas published over a model trained with hot replicas hold the keys,
    rows, optimizer state and tombstones of training without; a model with hot
    replicas warm-starts as one without."""
    case = HotCase("EXACT_ROWWISE_ADAGRAD", "SUM", "hash_roundrobin")
    results = run_ranks(deltas_and_warm_start, 2, case, str(tmp_path))
    for rank, r in enumerate(results):
        assert r["stats_True"]["local_ids"] > 0 and r["warm_stats_True"]["local_ids"] > 0
        plain, hot = r["deltas_False"], r["deltas_True"]
        assert len(plain) == len(hot) >= 3
        for version, (want, got) in enumerate(zip(plain, hot), 1):
            assert want.keys() == got.keys(), version
            for name, (keys, values, state, tombstones) in want.items():
                g_keys, g_values, g_state, g_tombstones = got[name]
                where = f"delta {version} {name}"
                assert keys.numel() and torch.equal(keys, g_keys), f"{where}: other keys upserted"
                assert torch.equal(tombstones, g_tombstones), f"{where}: other tombstones"
                torch.testing.assert_close(g_values, values, rtol=RTOL, atol=ATOL, msg=where)
                torch.testing.assert_close(g_state, state, rtol=RTOL, atol=ATOL, msg=where)
        for step, (got, want) in enumerate(zip(r["warm_True"], r["warm_False"])):
            torch.testing.assert_close(
                got, want, rtol=RTOL, atol=ATOL,
                msg=lambda m, s=step, k=rank: f"warm start rank {k} step {s}: {m}",
            )  # fmt: skip
        for name, (keys, rows, _) in r["warm_entries_False"].items():
            hot_keys, hot_rows, _ = r["warm_entries_True"][name]
            assert torch.equal(keys, hot_keys), f"warm start {name}: other keys stored"
            torch.testing.assert_close(hot_rows, rows, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("sharding_type", ["table_wise", "column_wise", "table_row_wise"])
def test_hot_replicas_refused_outside_row_wise(sharding_type):
    config = EmbeddingTableConfig(num_embeddings=10, embedding_dim=4, name="t", feature_names=["f"])
    sharding = DynamicEmbParameterSharding(
        sharding_type=sharding_type,
        compute_kernel=DYNAMIC_KERNEL_NAME,
        ranks=[0],
        dynamicemb_options=DynamicEmbTableOptions(dim=4, max_capacity=64, hot_replicas=8),
    )
    info = EmbeddingShardingInfo(config, sharding, torch.empty(0))
    with pytest.raises(
        ValueError, match=rf"\['t'\] set hot_replicas but are planned '{sharding_type}'"
    ):
        check_sharding_type(sharding_type, [info])
    check_sharding_type("row_wise", [info])  # accepted there
