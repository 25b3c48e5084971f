"""dynemb.telemetry over a BatchedDynamicEmbeddingTables module: each table's counts
of training steps against a set-based replay of the distinct keys (the oracle), the
flat metrics and their rates, the TensorBoard writer, the text summary, a cached
table's telemetry against its CacheStats, and the errors."""

import numpy as np
import pytest
import torch
import torch.nn as nn

import dynemb
from dynemb import BatchedDynamicEmbeddingTables, DynamicEmbTableOptions, DynamicEmbTelemetry

STEPS = 12


def _module(device, caching=False, capacity=1024):
    """t0 (features f0, f1) and t1 (feature f2), STEP scores."""
    options = []
    for _ in range(2):
        o = DynamicEmbTableOptions(dim=4, max_capacity=capacity, bucket_capacity=16,
                                   score_strategy=dynemb.DynamicEmbScoreStrategy.STEP)  # fmt: skip
        if caching:
            o.caching, o.local_hbm_for_values = True, 64 * 4 * 4  # 64 rows (SGD: no state)
        options.append(o)
    return BatchedDynamicEmbeddingTables(
        options, [0, 0, 1], table_names=["t0", "t1"], device=device
    )


def _batches(seed=0):
    """STEPS batches of 3 features x 4 samples, keys from a pool of 200 (repeats)."""
    rng = np.random.default_rng(seed)
    for _ in range(STEPS):
        lengths = rng.integers(0, 5, 12)
        keys = rng.integers(0, 200, int(lengths.sum())) * 0x9E3779B97F4A7  # spread, < 2**63
        offsets = np.concatenate([[0], np.cumsum(lengths)])
        yield torch.from_numpy(keys), torch.from_numpy(offsets)


def _oracle(batches):
    """Per table, per step: (hits, inserted) of its distinct keys, by a set of the keys seen."""
    seen = {"t0": set(), "t1": set()}
    steps = {"t0": [], "t1": []}
    for keys, offsets in batches:
        per_table = {"t0": keys[: offsets[8]].tolist(), "t1": keys[offsets[8] :].tolist()}
        for name, ks in per_table.items():
            if not ks:
                continue  # no lookup of this table in the step
            distinct = set(ks)
            hits = len(distinct & seen[name])
            steps[name].append((hits, len(distinct) - hits))
            seen[name] |= distinct
    return steps


def _train(module, batches, device):
    for keys, offsets in batches:
        module(keys.to(device), offsets.to(device)).sum().backward()


def test_module_counts_match_a_replay_of_distinct_keys(device):
    module = _module(device)
    telemetry = DynamicEmbTelemetry(module, window=5)
    _train(module, _batches(), device)
    want = _oracle(_batches())
    tables = module.telemetry()
    assert tables.keys() == {"t0", "t1"} and tables == telemetry.tables()
    metrics = telemetry.metrics()
    for name, t in tables.items():
        steps = want[name]
        assert [(s.hits, s.inserted) for s in t.recent] == steps[-5:]
        assert (t.steps, t.evicted, t.failed) == (len(steps), 0, 0)
        assert t.hits == sum(h for h, _ in steps) and t.inserted == sum(i for _, i in steps)
        m = {k.split("/")[-1]: v for k, v in metrics.items() if k.startswith(f"dynemb/{name}/")}
        assert (m["hits"], m["inserted"], m["steps"]) == (t.hits, t.inserted, t.steps)
        assert m["step_hits"] == steps[-1][0] and m["step_inserted"] == steps[-1][1]
        window = steps[-5:]
        looked_up = sum(h + i for h, i in window)
        assert m["window_hit_rate"] == pytest.approx(sum(h for h, _ in window) / looked_up)
        assert m["window_eviction_rate"] == 0.0
        table = module.tables[["t0", "t1"].index(name)]
        assert m["size"] == table.size() == t.inserted
        assert m["load_factor"] == pytest.approx(table.size() / table.capacity())
    module.eval()  # eval lookups insert nothing and are not counted
    _train_eval = next(iter(_batches(seed=1)))
    module(_train_eval[0].to(device), _train_eval[1].to(device))
    assert module.telemetry()["t0"].steps == len(want["t0"])


def test_evictions_reach_the_detailed_metrics(device):
    module = _module(device, capacity=32)
    telemetry = DynamicEmbTelemetry(module, sample_every=1)
    _train(module, _batches(), device)
    metrics = telemetry.metrics(detailed=True)
    t0 = module.telemetry()["t0"]
    assert t0.evicted > 0
    ev, fill = t0.evictions(), t0.bucket_fill()
    assert metrics["dynemb/t0/evictions_sampled"] == ev.count == t0.evicted
    assert metrics["dynemb/t0/eviction_rank_mean"] == pytest.approx(ev.rank_mean)
    assert metrics["dynemb/t0/eviction_age_p50"] == ev.age_p50 and ev.age_unit == "steps"
    assert metrics["dynemb/t0/bucket_fill_max"] == fill.max == 16
    assert "dynemb/t0/eviction_age_p50" not in telemetry.metrics()  # on demand only


class _Recorder:
    """A writer with SummaryWriter's add_scalar, keeping what it was given."""

    def __init__(self):
        self.scalars = []

    def add_scalar(self, tag, value, step):
        self.scalars.append((tag, value, step))


def test_write_to_tensorboard_writes_every_metric(device):
    module = _module(device)
    _train(module, _batches(), device)
    telemetry = DynamicEmbTelemetry(module)
    writer = _Recorder()
    written = telemetry.write_to_tensorboard(writer, 7, detailed=True)
    assert written == telemetry.metrics(detailed=True)
    assert writer.scalars == [(tag, value, 7) for tag, value in written.items()]
    with pytest.raises(TypeError, match="writer must have add_scalar.*got list"):
        telemetry.write_to_tensorboard([], 7)


def test_summary_writer_when_tensorboard_is_installed(tmp_path, device):
    pytest.importorskip("tensorboard")
    from torch.utils.tensorboard import SummaryWriter

    module = _module(device)
    _train(module, _batches(), device)
    with SummaryWriter(str(tmp_path)) as writer:
        DynamicEmbTelemetry(module).write_to_tensorboard(writer, 1)
    assert any(tmp_path.iterdir())


def test_summary_has_a_line_per_table(device):
    module = _module(device, capacity=32)
    DynamicEmbTelemetry(module, sample_every=1)
    _train(module, _batches(), device)
    lines = DynamicEmbTelemetry(module).summary().splitlines()
    assert lines[0].split()[:2] == ["table", "steps"]
    t0 = module.telemetry()["t0"]
    assert lines[1].split()[:5] == ["t0", str(t0.steps), str(t0.hits), str(t0.inserted),
                                    str(t0.evicted)]  # fmt: skip
    assert "steps" in lines[1]  # the evicted age's unit


def test_cached_table_reports_its_cache(device):
    module = _module(device, caching=True)
    _train(module, _batches(), device)
    for table, (name, t) in zip(module.tables, module.telemetry().items()):
        stats = table.cache_stats
        assert t.hits == stats.lookup_hits, name
        assert t.hits + t.inserted + t.evicted + t.failed == stats.lookup_keys, name
        assert t.evicted > 0, name  # a 64-row cache for 200 keys evicts


def test_models_and_errors():
    module = _module("cpu")
    wrapper = nn.Sequential(nn.Linear(1, 1), module)
    assert dynemb.table_telemetry(wrapper).keys() == {"t0", "t1"}
    with pytest.raises(ValueError, match="two dynamic tables are named 't0'"):
        dynemb.table_telemetry(nn.ModuleList([module, _module("cpu")]))
    with pytest.raises(TypeError, match="model must be a torch.nn.Module, got dict"):
        dynemb.table_telemetry({})
    with pytest.raises(ValueError, match="window must be >= 1, got 0"):
        DynamicEmbTelemetry(module, window=0)
