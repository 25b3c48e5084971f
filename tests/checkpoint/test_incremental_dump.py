"""dynemb.incremental_dump: get_score / incremental_dump return exactly the entries updated
since a score reference (sharded on 2 gloo ranks, and per strategy on bare tables);
set_score accepts CUSTOMIZED tables only."""

import warnings

import pytest
import torch

from dynemb import (
    BatchedDynamicEmbeddingTables,
    DynamicEmbScoreStrategy,
    DynamicEmbTableOptions,
)
from dynemb.checkpoint import incremental as inc
from dynemb.incremental_dump import get_score, set_score
from tests.support.incremental_dump_workers import TOUCHED, FakeClock, dump_after_training
from tests.support.multiprocess import run_ranks

S = DynamicEmbScoreStrategy


def incremental_dump(model, threshold):
    """These tests read the scores too: dynemb's ``with_scores`` 3-tuples."""
    return inc.incremental_dump(model, threshold, with_scores=True)


# ------------------------------------------------------------- sharded model


SPAWNED = pytest.mark.no_emulated_pass("2 spawned ranks: the gather protocol is Python")


@pytest.fixture(scope="module")
def sharded():
    return run_ranks(dump_after_training, 2)


def _sorted(entry):
    keys, rows, scores = entry
    order = torch.argsort(keys)
    return keys[order], rows[order], scores[order]


@SPAWNED
def test_sharded_dump_returns_the_keys_touched_since_get_score_from_every_rank(sharded):
    expected = {"t0": set(), "t1": set()}
    for per_feature in TOUCHED.values():
        expected["t0"].update(per_feature["f0"] + per_feature["f1"])
        expected["t1"].update(per_feature["f2"])
    for r in sharded:
        (coll,) = r["touched"]  # one sharded collection
        assert set(r["before"][coll]) == {"t0", "t1"}
        for name in ("t0", "t1"):
            keys, rows, scores = r["touched"][coll][name]
            assert keys.device.type == "cpu" and rows.device.type == "cpu"
            assert sorted(keys.tolist()) == sorted(expected[name])  # each key once
            assert rows.shape == (keys.numel(), 4 if name == "t0" else 8)
            assert (scores == r["clock"]).all()  # the fake clock of the touching step
            assert r["current"][coll][name] == r["clock"]
    # every rank receives the same entries: each row is its owner rank's row
    a, b = (_sorted(r["touched"][coll]["t0"]) for r in sharded)
    for x, y in zip(a, b):
        assert torch.equal(x, y)
    owner = {}
    for r in sharded:
        for name, (keys, rows, _) in r["local"].items():
            for k, row in zip(keys.tolist(), rows):
                owner[(name, k)] = row
    for name in ("t0", "t1"):
        keys, rows, _ = sharded[0]["touched"][coll][name]
        for k, row in zip(keys.tolist(), rows):
            assert torch.equal(row, owner[(name, k)])


@SPAWNED
def test_sharded_dump_is_empty_when_nothing_was_touched(sharded):
    for r in sharded:
        for tables in r["nothing"].values():
            for keys, rows, scores in tables.values():
                assert keys.numel() == 0 and rows.shape[0] == 0 and scores.numel() == 0


@SPAWNED
def test_sharded_dump_from_zero_gathers_every_rank_entries(sharded):
    for r in sharded:
        (coll,) = r["everything"]
        for name in ("t0", "t1"):
            keys = r["everything"][coll][name][0]
            local = torch.cat([s["local"][name][0] for s in sharded])
            assert sorted(keys.tolist()) == sorted(local.tolist())


# ---------------------------------------------------------------- bare tables


def _tables(strategy, bucket_capacity=128, capacity=256) -> BatchedDynamicEmbeddingTables:
    options = [
        DynamicEmbTableOptions(
            dim=4, max_capacity=capacity, score_strategy=strategy, bucket_capacity=bucket_capacity
        )
        for _ in range(2)
    ]
    return BatchedDynamicEmbeddingTables(options, [0, 1], table_names=["t0", "t1"])


def _train(tables, keys0, keys1) -> None:
    """One batch of one sample: feature 0 (t0) looks ``keys0`` up, feature 1 (t1) ``keys1``."""
    indices = torch.tensor(keys0 + keys1, dtype=torch.int64)
    offsets = torch.tensor([0, len(keys0), len(keys0) + len(keys1)])
    tables(indices, offsets).sum().backward()


def _keys(dumped, name):
    return sorted(dumped["model"][name][0].tolist())


@pytest.mark.parametrize("strategy", [S.TIMESTAMP, (S.TIMESTAMP, S.LFU)])
def test_timestamp_dump_filters_by_last_access_time(strategy):
    tables = _tables(strategy)
    clock = FakeClock(100)
    for t in tables.tables:
        t.state.clock = clock
    _train(tables, [1, 2, 3], [10, 11])
    clock.now = 200
    before = get_score(tables)
    assert before == {"model": {"t0": 200, "t1": 200}}
    assert _keys(incremental_dump(tables, before)[0], "t0") == []
    _train(tables, [2, 4, 2], [])  # a key hit twice, a new key; t1 untouched
    dumped, current = incremental_dump(tables, before)
    assert _keys(dumped, "t0") == [2, 4] and _keys(dumped, "t1") == []
    assert dumped["model"]["t0"][2].tolist() == [200, 200]  # last-access times, not LFU counts
    assert current == before
    assert _keys(incremental_dump(tables, 0)[0], "t0") == [1, 2, 3, 4]


def test_step_reference_is_the_next_batch_step():
    tables = _tables(S.STEP)
    _train(tables, [1, 2], [5])
    _train(tables, [3], [5])
    before = get_score(tables)
    assert before == {"model": {"t0": 3, "t1": 3}}
    assert _keys(incremental_dump(tables, before)[0], "t0") == []
    tables.eval()
    _train(tables, [1, 2, 3], [5])  # eval lookups change no score
    tables.train()
    assert _keys(incremental_dump(tables, before)[0], "t0") == []
    _train(tables, [2, 7], [])
    dumped, current = incremental_dump(tables, before)
    assert _keys(dumped, "t0") == [2, 7] and _keys(dumped, "t1") == []
    assert current == {"model": {"t0": 4, "t1": 4}}  # t1 had an empty batch: still a step
    # a per-collection dict may name a subset of the tables; one int covers all
    assert list(incremental_dump(tables, {"model": {"t1": 0}})[0]["model"]) == ["t1"]
    assert _keys(incremental_dump(tables, 2)[0], "t0") == [2, 3, 7]


def test_lfu_reference_is_the_highest_count():
    tables = _tables(S.LFU)
    _train(tables, [1, 1, 1, 2], [3])
    assert get_score(tables) == {"model": {"t0": 3, "t1": 1}}
    dumped, _ = incremental_dump(tables, 2)
    assert _keys(dumped, "t0") == [1] and _keys(dumped, "t1") == []


def test_no_eviction_tables_are_always_dumped_whole():
    tables = _tables(S.NO_EVICTION)
    _train(tables, [1, 2], [3])
    assert get_score(tables) == {"model": {"t0": 0, "t1": 0}}
    dumped, _ = incremental_dump(tables, 10**9)
    assert _keys(dumped, "t0") == [1, 2] and _keys(dumped, "t1") == [3]


def test_dump_scans_in_chunks_and_returns_each_entry_once(monkeypatch):
    monkeypatch.setattr(inc, "_CHUNK_SLOTS", 16)
    tables = _tables(S.STEP, bucket_capacity=16, capacity=1024)
    keys = list(range(-300, 300, 3))
    _train(tables, keys, [])
    dumped, _ = incremental_dump(tables, 0)
    k, rows, _ = dumped["model"]["t0"]
    assert sorted(k.tolist()) == keys
    expected, found = tables.tables[0].find(k)
    assert found.all() and torch.equal(rows, expected)


def test_customized_set_score_is_the_reference_and_dump_filters_by_it():
    tables = _tables(S.CUSTOMIZED)
    t0 = tables.tables[0]
    assert get_score(tables) == {"model": {"t0": 0, "t1": 0}}  # empty: the highest stored score
    t0.insert_or_assign(torch.tensor([1, 2]), torch.ones(2, 4), torch.tensor([5, 9]))
    assert get_score(tables)["model"]["t0"] == 9
    set_score(tables, {"model": {"t0": 10}})
    assert get_score(tables) == {"model": {"t0": 10, "t1": 0}}
    t0.insert_or_assign(torch.tensor([2, 3]), torch.ones(2, 4), torch.tensor([10, 10]))
    dumped, current = incremental_dump(tables, get_score(tables))
    assert _keys(dumped, "t0") == [2, 3] and dumped["model"]["t0"][2].tolist() == [10, 10]
    assert current["model"]["t0"] == 10
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        set_score(tables, {"model": {"t0": 10, "t1": 3}})  # equal or up: no warning
    with pytest.warns(UserWarning, match="goes down from 10 to 4"):
        set_score(tables, {"model": {"t0": 4}})
    assert get_score(tables)["model"]["t0"] == 4


@pytest.mark.parametrize(
    "table_score, error, match",
    [
        ({"ebc": {"t0": 1}}, ValueError, "unknown collection 'ebc'"),
        ({"model": {"t9": 1}}, ValueError, "unknown table 't9'"),
        ({"model": {"t0": -1}}, ValueError, ">= 0"),
        ({"model": {"t0": 1.5}}, TypeError, "must be an int"),
        ({"model": {"t0": 1, "t1": 2}}, ValueError, "only CUSTOMIZED"),  # t1 is STEP
    ],
)
def test_set_score_errors_change_nothing(table_score, error, match):
    options = [
        DynamicEmbTableOptions(dim=4, max_capacity=256, score_strategy=s)
        for s in (S.CUSTOMIZED, S.STEP)
    ]
    tables = BatchedDynamicEmbeddingTables(options, [0, 1], table_names=["t0", "t1"])
    with pytest.raises(error, match=match):
        set_score(tables, table_score)
    assert get_score(tables) == {"model": {"t0": 0, "t1": 1}}


@pytest.mark.parametrize(
    "threshold, error, match",
    [
        ({"x": {"t0": 0}}, ValueError, "unknown collection 'x'"),
        ({"model": {"t2": 0}}, ValueError, "unknown table 't2'"),
        ({"model": 0}, TypeError, "must be a dict"),
        ("0", TypeError, "score_threshold must be an int"),
        (True, TypeError, "score_threshold must be an int"),
    ],
)
def test_incremental_dump_rejects_bad_thresholds(threshold, error, match):
    with pytest.raises(error, match=match):
        incremental_dump(_tables(S.STEP), threshold)
