"""DYNAMICEMB_API.md section 13: the public members of BatchedDynamicEmbeddingTablesV2 used
as DynamicEmb documents them, on one CPU process."""

import inspect
import json
import math

import pytest
import torch

from dynemb import (
    DynamicEmbDump,
    DynamicEmbInitializerArgs,
    DynamicEmbInitializerMode,
    DynamicEmbScoreStrategy,
    DynamicEmbTableOptions,
    EmbOptimType,
)
from dynemb.batched_dynamicemb_tables import BatchedDynamicEmbeddingTablesV2
from dynemb.tiering import Cache

S = DynamicEmbScoreStrategy
DIM = 4
DEBUG = DynamicEmbInitializerArgs(mode=DynamicEmbInitializerMode.DEBUG)


def module(*strategies, caching=False, optimizer=EmbOptimType.ADAM, **kwargs):
    options = []
    for s in strategies or (S.TIMESTAMP,):
        o = DynamicEmbTableOptions(
            dim=DIM, max_capacity=256, bucket_capacity=16, score_strategy=s, initializer_args=DEBUG
        )
        if caching:
            o.caching, o.local_hbm_for_values = True, 64 * (DIM + 2 * DIM) * 4
        options.append(o)
    names = [f"t{i}" for i in range(len(options))]
    return BatchedDynamicEmbeddingTablesV2(
        options, table_names=names, optimizer=optimizer, **kwargs
    )


def train(m, keys: list[int]) -> None:
    """One training batch: every table's feature gets ``keys`` as one bag."""
    t = len(m.table_names)
    indices = torch.tensor(keys * t, dtype=torch.int64)
    offsets = torch.arange(0, len(keys) * t + 1, len(keys), dtype=torch.int64)
    m(indices, offsets).sum().backward()


class Clock:
    def __init__(self) -> None:
        self.now = 1_000

    def __call__(self) -> int:
        return self.now


def test_member_signatures_and_defaults():
    V2 = BatchedDynamicEmbeddingTablesV2

    def params(f):
        return {n: p.default for n, p in list(inspect.signature(f).parameters.items())[1:]}

    assert params(V2.dump) == {"save_dir": inspect.Parameter.empty, "optim": False,
                               "counter": False, "table_names": None, "pg": None,
                               "format": "dynemb"}  # fmt: skip
    assert params(V2.load) == {"save_dir": inspect.Parameter.empty, "optim": False,
                               "counter": False, "table_names": None, "pg": None}  # fmt: skip
    assert params(V2.export_keys_values) == {"table_name": inspect.Parameter.empty,
                                             "device": inspect.Parameter.empty,
                                             "batch_size": 65536}  # fmt: skip
    assert params(V2.incremental_dump) == {"named_thresholds": None, "pg": None}
    assert params(V2.fill_tables) == {"load_factor": 0.95, "tolerance": 1e-5}
    assert list(params(V2.set_score)) == ["named_score"]
    assert list(params(V2.set_record_cache_metrics)) == ["record"]
    assert list(params(V2.set_learning_rate)) == ["lr"]
    for name in ("get_score", "split_embedding_weights", "flush", "reset_cache_states"):
        assert params(getattr(V2, name)) == {}
    for name in ("optimizer", "cache", "enable_prefetch"):
        assert isinstance(getattr(V2, name), property)


def test_properties():
    m = module(S.TIMESTAMP, S.LFU, learning_rate=0.5)
    assert m.table_names == ["t0", "t1"]
    assert len(m.tables) == 2
    assert m.optimizer.optimizer == EmbOptimType.ADAM and m.optimizer.learning_rate == 0.5
    m.set_learning_rate(0.25)
    assert m.optimizer.learning_rate == 0.25
    assert m.cache is None  # no table caches
    assert module(caching=True).cache[0] is not None
    assert isinstance(module(caching=True).cache[0], Cache)


def test_split_embedding_weights_one_placeholder_per_table():
    weights = module(S.TIMESTAMP, S.LFU).split_embedding_weights()
    assert [tuple(w.shape) for w in weights] == [(0, DIM), (0, DIM)]


def test_enable_prefetch_and_record_cache_metrics():
    m = module(caching=True, prefetch_pipeline=True)
    assert m.enable_prefetch is True
    m.enable_prefetch = False
    assert m.enable_prefetch is False
    assert module().enable_prefetch is False
    with pytest.raises(TypeError, match="enable_prefetch must be a bool, got 1"):
        m.enable_prefetch = 1
    m.set_record_cache_metrics(True)
    with pytest.raises(TypeError, match="`record` must be a bool, got 'yes'"):
        m.set_record_cache_metrics("yes")


def test_get_score_and_set_score():
    m = module(S.STEP, S.CUSTOMIZED, S.LFU)
    train(m, [1, 2, 2])
    assert m.get_score() == {"t0": 2, "t1": 0, "t2": 2}  # next step; custom; max count
    m.set_score({"t1": 9})
    train(m, [3])
    assert m.get_score()["t1"] == 9
    rows, _ = m.incremental_dump({"t1": 9})
    assert rows["t1"][0].tolist() == [3]
    with pytest.warns(UserWarning, match="goes down from 9 to 4"):
        m.set_score({"t1": 4})
    with pytest.raises(ValueError, match="only CUSTOMIZED tables take a score"):
        m.set_score({"t0": 5})
    with pytest.raises(TypeError, match="`named_score` must be a dict"):
        m.set_score(5)


def test_get_score_of_timestamp_tables_is_the_time():
    m = module(S.TIMESTAMP)
    clock = Clock()
    m.tables[0].state.clock = clock
    clock.now = 123_456
    assert m.get_score() == {"t0": 123_456}


def test_incremental_dump_timestamp_rows_touched_since_the_threshold():
    m = module(S.TIMESTAMP, (S.TIMESTAMP, S.LFU))
    clock = Clock()
    for t in m.tables:
        t.state.clock = clock
    train(m, [1, 2])
    clock.now += 10
    ref = m.get_score()
    assert ref == {"t0": clock.now, "t1": clock.now}
    nothing, _ = m.incremental_dump(ref)
    assert all(k.numel() == 0 for k, _ in nothing.values())
    clock.now += 10
    train(m, [2, 7])
    rows, new_ref = m.incremental_dump(ref)
    for name in ("t0", "t1"):
        keys, values = rows[name]
        assert sorted(keys.tolist()) == [2, 7]
        assert values.shape == (2, DIM) and values.dtype == torch.float32
    assert new_ref == {"t0": clock.now, "t1": clock.now}


def test_incremental_dump_other_strategies_by_score():
    m = module(S.STEP, S.LFU, S.NO_EVICTION)
    train(m, [1, 2])  # step 1
    train(m, [2, 3])  # step 2; counts 1: 1, 2: 2, 3: 1
    rows, ref = m.incremental_dump({"t0": 2, "t1": 2, "t2": 0})
    assert sorted(rows["t0"][0].tolist()) == [2, 3]
    assert rows["t1"][0].tolist() == [2]
    assert sorted(rows["t2"][0].tolist()) == [1, 2, 3]
    assert ref == m.get_score()
    everything, _ = m.incremental_dump()  # None: every row of every table
    assert {n: sorted(k.tolist()) for n, (k, _) in everything.items()} == {
        n: [1, 2, 3] for n in ("t0", "t1", "t2")
    }
    only, _ = m.incremental_dump({"t1": 0})
    assert list(only) == ["t1"]
    with pytest.raises(TypeError, match="`named_thresholds` must be a dict"):
        m.incremental_dump(3)


def test_export_keys_values():
    m = module(S.LFU)
    train(m, [5, 70000, 5])
    keys, values = m.export_keys_values("t0", torch.device("cpu"), batch_size=16)
    order = keys.argsort()
    assert keys[order].tolist() == [5, 70000]
    # DEBUG rows start at key mod 100000; one Adam step (lr 0.01) moved them a little
    assert torch.allclose(values[order][:, 0], torch.tensor([5.0, 70000.0]), atol=0.1)
    with pytest.raises(ValueError, match="`table_name` 'nope' is not a table"):
        m.export_keys_values("nope", torch.device("cpu"))
    with pytest.raises(ValueError, match="`batch_size` must be an int >= 1, got 0"):
        m.export_keys_values("t0", torch.device("cpu"), batch_size=0)


@pytest.mark.parametrize("fmt", ["dynemb", "dynamicemb"])
def test_dump_and_load_round_trip(tmp_path, fmt):
    m = module(S.STEP, S.LFU)
    train(m, [1, 2, 3])
    m.dump(str(tmp_path), optim=True, format=fmt)
    m.dump(str(tmp_path), optim=True, format=fmt)  # dumps over an earlier one
    fresh = module(S.STEP, S.LFU)
    fresh.load(str(tmp_path), optim=True)
    for name in m.table_names:
        k0, v0 = m.export_keys_values(name, torch.device("cpu"))
        k1, v1 = fresh.export_keys_values(name, torch.device("cpu"))
        assert torch.equal(k0.sort().values, k1.sort().values)
        assert torch.equal(v0[k0.argsort()], v1[k1.argsort()])
    assert fresh.get_score() == m.get_score()


def test_dump_writes_the_files_of_dynamicemb_dump(tmp_path):
    m = module(S.STEP)
    train(m, [1, 2])
    m.dump(str(tmp_path / "member"), format="dynamicemb")
    DynamicEmbDump(tmp_path / "model", m, format="dynamicemb")
    member = sorted(p.relative_to(tmp_path / "member") for p in (tmp_path / "member").rglob("*"))
    model = sorted(p.relative_to(tmp_path / "model") for p in (tmp_path / "model").rglob("*"))
    assert member == model
    for rel in member:
        a, b = tmp_path / "member" / rel, tmp_path / "model" / rel
        if a.is_file() and a.suffix != ".json":
            assert a.read_bytes() == b.read_bytes()
    args = json.loads((tmp_path / "member" / "model" / "t0_opt_args.json").read_text())
    assert args["opt_type"] == "adam"


def test_dump_and_load_some_tables(tmp_path):
    m = module(S.STEP, S.LFU)
    train(m, [4])
    m.dump(str(tmp_path), table_names=["t1"])
    fresh = module(S.STEP, S.LFU)
    fresh.load(str(tmp_path), table_names=["t1"])
    assert [t.size() for t in fresh.tables] == [0, 1]


@pytest.mark.parametrize("strategy", [S.TIMESTAMP, S.STEP, S.CUSTOMIZED, S.LFU, S.NO_EVICTION])
def test_fill_tables_reaches_the_load_factor(strategy):
    m = module(strategy)
    m.fill_tables(load_factor=0.5)
    table = m.tables[0]
    assert table.size() >= math.ceil((0.5 - 1e-5) * table.capacity())
    m.fill_tables()
    assert table.size() >= (0.95 - 1e-5) * table.capacity()
    train(m, [1])  # still a working table
    with pytest.raises(ValueError, match=r"`load_factor` must be in \(0, 1\], got 1.5"):
        m.fill_tables(load_factor=1.5)
    with pytest.raises(ValueError, match=r"`tolerance` must be in \[0, 1\), got -1"):
        m.fill_tables(tolerance=-1)


def test_flush_and_reset_cache_states_keep_every_row():
    m = module(caching=True, optimizer=EmbOptimType.ADAM)
    keys = list(range(100))  # more than the cache holds
    train(m, keys)
    cache = m.cache[0]
    assert cache.cache_size() > 0 and cache.stats.lookup_keys > 0
    m.flush()
    m.reset_cache_states()
    assert cache.cache_size() == 0 and cache.stats.lookup_keys == 0
    k, _ = m.export_keys_values("t0", torch.device("cpu"))
    assert sorted(k.tolist()) == keys
    train(m, [1, 2])  # still a working table


def test_reset_cache_states_between_batches_only():
    m = module(caching=True)
    m.prefetch(torch.tensor([1, 2]), torch.tensor([0, 2]))
    with pytest.raises(RuntimeError, match=r"tables \['t0'\] have batches in flight"):
        m.reset_cache_states()


def test_caching_members_are_harmless_without_caching():
    m = module(S.LFU)
    train(m, [1])
    m.reset_cache_states()
    m.flush()
    m.set_record_cache_metrics(False)
    assert m.tables[0].size() == 1
