"""Eviction by rule through BatchedDynamicEmbeddingTables: a scheduled rule scans at most
``buckets_per_step`` buckets per training forward and erases what the table's oracle
(its own scores, read before the pass) says is stale; ``erase_stale`` on demand, on the
module and on a model; telemetry counts; deltas tombstone the erased keys;
``erased_since`` reports them beside an incremental dump; caching mode erases from both
tiers; both executors erase the same keys."""

import os
import subprocess
import sys

import pytest
import torch
from torch import nn

from dynemb import (
    BatchedDynamicEmbeddingTables,
    DynamicEmbPoolingMode,
    DynamicEmbScoreStrategy,
    DynamicEmbTableOptions,
)
from dynemb.deltas import DeltaPublisher, delta_path, read_delta
from dynemb.eviction_rules import EvictionRule, erase_stale, erased_mark, erased_since
from dynemb.incremental_dump import get_score, incremental_dump
from dynemb.optimizer import EmbOptimType
from dynemb.telemetry import step_metrics

STEP = DynamicEmbScoreStrategy.STEP


def make(rule=None, caching=False, strategy=STEP, tables=1):
    opts = [
        DynamicEmbTableOptions(
            dim=4, max_capacity=4096, init_capacity=4096, bucket_capacity=16, seed=t,
            score_strategy=strategy, eviction_rule=rule, caching=caching,
            local_hbm_for_values=512 * 4 * 4 if caching else 0,
        )
        for t in range(tables)
    ]  # fmt: skip
    return BatchedDynamicEmbeddingTables(
        opts, feature_table_map=list(range(tables)), pooling_mode=DynamicEmbPoolingMode.SUM,
        optimizer=EmbOptimType.EXACT_SGD, learning_rate=0.1,
    )  # fmt: skip


def batch(step: int, tables: int = 1):
    """Step ``step``'s keys: 40 of a sliding range (old keys fall out of use) and a hot 8."""
    keys = torch.cat([torch.arange(step * 20, step * 20 + 40), torch.arange(8)])
    indices = torch.cat([keys + t * 100_000 for t in range(tables)])
    return indices, torch.arange(0, indices.numel() + 1, 4)


def train(m, steps, start=0, tables=1):
    for s in range(start, start + steps):
        m(*batch(s, tables)).sum().backward()


def contents(m, t=0):
    table = m.tables[t]
    table = table.persistent_table() if table.has_cache else table
    keys, values, scores, _ = table.export_batch(0, table.capacity())
    order = keys.argsort()
    return keys[order], values[order], scores[order]


def test_scheduled_rule_scans_a_bounded_chunk_per_step_and_erases_the_stale():
    rule = EvictionRule(max_idle_steps=5, every_n_steps=10, buckets_per_step=32)
    m = make(rule)
    table = m.tables[0]
    buckets = table.num_buckets  # 256: a pass takes 8 forwards
    tel = table.telemetry
    train(m, 10)
    assert tel.rule_passes == 0 and tel.rule_buckets == 0
    # The table is at step 10: the next forward starts a pass, its thresholds from the
    # table's step now (a STEP score is the step of the key's last access).
    assert table.score_step == 10
    keys, _, scores = contents(m)
    want = set(keys[scores < 10 - 5].tolist())
    seen = []
    for s in range(10, 10 + buckets // 32):
        before = tel.rule_buckets
        m(*batch(s)).sum().backward()
        seen.append(tel.rule_buckets - before)
    assert tel.rule_passes == 1 and seen == [32] * (buckets // 32)
    # Stale at the pass's start: last access more than 5 steps before step 10 (the
    # batches of the pass touch only new keys and the hot 8, which are never stale).
    assert want and tel.rule_erased == len(want)
    assert not set(contents(m)[0].tolist()) & want
    metrics = step_metrics(tel)
    assert metrics["rule_passes"] == 1.0 and metrics["rule_erased"] == float(len(want))


def test_load_factor_starts_a_pass():
    rule = EvictionRule(max_idle_steps=2, load_factor_above=0.1, buckets_per_step=1 << 10)
    m = make(rule)
    train(m, 30)  # 20 new keys a step: above 410 keys (0.1 of 4096) a pass erases the idle
    tel = m.tables[0].telemetry
    assert tel.rule_passes >= 1 and tel.rule_erased > 0
    assert m.tables[0].size() < 0.1 * 4096 + 48


def test_erase_stale_on_demand_module_and_model():
    m = make(tables=2)
    train(m, 6, tables=2)
    keys, _, scores = contents(m, 1)
    step = m.tables[1].score_step
    want = int((scores < step - 2).sum())
    assert m.erase_stale(EvictionRule(max_idle_steps=2)) == {"table_0": want, "table_1": want}
    model = nn.Sequential(nn.Identity(), m)
    left = [m.tables[t].size() - 48 for t in (0, 1)]  # all but the last batch's 48 keys
    assert erase_stale(model, EvictionRule(max_idle_steps=0)) == {
        "model.1": {"table_0": left[0], "table_1": left[1]}  # the path of incremental_dump
    }
    assert m.tables[0].size() == m.tables[1].size() == 48
    with pytest.raises(ValueError, match="table 'table_0'.*min_count=2 needs a count"):
        m.erase_stale(EvictionRule(min_count=2))
    with pytest.raises(TypeError, match="rule must be an EvictionRule"):
        m.erase_stale("old")
    assert m.erase_stale() == {}  # no table has a rule of its own


def test_a_rule_the_strategy_cannot_decide_is_refused_naming_the_table():
    with pytest.raises(ValueError, match="table 'table_0'.*max_idle_steps=3 needs a STEP"):
        make(EvictionRule(max_idle_steps=3), strategy=DynamicEmbScoreStrategy.LFU)
    with pytest.raises(ValueError, match="load_factor_above needs a table in memory"):
        make(EvictionRule(max_idle_steps=3, load_factor_above=0.5), caching=True)


def test_keys_of_a_forward_awaiting_its_backward_are_kept():
    m = make()
    train(m, 4)
    out = m(*batch(0))  # keys of step 0 again: pinned until the backward
    pinned = set(batch(0)[0].tolist())
    m.tables[0].score_step += 5  # every key is now idle for more than 3 steps
    m.erase_stale(EvictionRule(max_idle_steps=3))
    assert set(contents(m)[0].tolist()) == pinned
    out.sum().backward()
    m.erase_stale(EvictionRule(max_idle_steps=3))
    assert contents(m)[0].numel() == 0


def test_deltas_tombstone_erased_keys_and_erased_since_reports_them(tmp_path):
    m = make()
    publisher = DeltaPublisher(m, tmp_path / "deltas")
    publisher.publish_base()
    mark = erased_mark(m)
    before = get_score(m)
    train(m, 6)
    publisher.publish()
    erased_n = m.erase_stale(EvictionRule(max_idle_steps=2))["table_0"]
    assert erased_n > 0
    version = publisher.publish()
    delta = read_delta(delta_path(publisher.directory, version))
    (d,) = delta.tables.values()
    erased, mark = erased_since(m, mark)
    gone = erased["model"]["table_0"]
    assert gone.numel() == erased_n
    assert set(d.tombstones.tolist()) == set(gone.tolist())
    assert not m.tables[0].contains(gone).any()
    # Beside an incremental dump: its (keys, rows) shape is unchanged; a reader erases
    # ``gone`` then applies the rows, and holds the table.
    dumped, _ = incremental_dump(m, before)
    keys, rows = dumped["model"]["table_0"]
    assert rows.shape == (keys.numel(), 4)
    assert not set(keys.tolist()) & set(gone.tolist())
    assert erased_since(m, mark)[0]["model"]["table_0"].numel() == 0  # taken
    publisher.close()


def test_caching_mode_erases_from_both_tiers():
    m = make(caching=True)
    train(m, 6)
    table = m.tables[0]
    keys, _, scores = contents(m)
    step = table.score_step
    stale = keys[scores < step - 2]
    assert stale.numel() > 0
    erased = m.erase_stale(EvictionRule(max_idle_steps=2))["table_0"]
    assert erased == stale.numel()
    assert not table.contains(stale).any()  # neither tier
    assert set(contents(m)[0].tolist()) == set(keys.tolist()) - set(stale.tolist())
    train(m, 2, start=6)  # trains on


def erase_and_save(path: str) -> None:
    """A scheduled rule in memory and an on-demand one in caching mode, this executor."""
    import dynemb

    out = {"executor": dynemb.executor()}
    m = make(EvictionRule(max_idle_steps=3, every_n_steps=4, buckets_per_step=64))
    train(m, 20)
    out["memory"] = contents(m)
    c = make(caching=True)
    train(c, 10)
    c.erase_stale(EvictionRule(max_idle_steps=3))
    train(c, 3, start=10)
    out["caching"] = contents(c)
    torch.save(out, path)


@pytest.mark.no_emulated_pass("runs both executors itself, each in its own process")
def test_both_executors_erase_the_same_keys(tmp_path):
    saved = {}
    for executor in ("cpu", "cuda-emulated"):
        path = tmp_path / f"{executor}.pt"
        env = {**os.environ, "DYNEMB_EXECUTOR": executor}
        code = (
            "from tests.tbe.test_eviction_rules_module import erase_and_save; "
            f"erase_and_save({str(path)!r})"
        )
        done = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
        )
        assert done.returncode == 0, done.stderr[-2000:]
        saved[executor] = torch.load(path)
        assert saved[executor]["executor"] == executor
    for mode in ("memory", "caching"):
        a, b = saved["cpu"][mode], saved["cuda-emulated"][mode]
        assert a[0].numel() > 0
        assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True)), mode
