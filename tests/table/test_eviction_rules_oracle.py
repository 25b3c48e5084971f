"""Eviction by rule against the dict-based ReferenceTable: after random upserts, a rule
erases exactly the keys whose stored score, last access or row norm the oracle says are
stale (by the predicate written out here from the oracle's entries), in one pass or in
bounded chunks, and keeps every key pinned by a batch in flight."""

import math

import numpy as np
import pytest
import torch

from dynemb.eviction_rules import EvictionRule
from tests.support import reference as ref
from tests.support.table_harness import Harness

BIG = 1 << 40  # past the last bucket


def oracle_stale(h: Harness, rule: EvictionRule, step: int, now: int) -> set[int]:
    """The keys the oracle's entries say are stale by ``rule`` at ``step`` / ``now``."""
    code, out = h.code, set()
    for key, (row, score, stamp) in h.oracle.entries.items():
        stale = False
        if rule.max_idle_steps is not None:
            stale |= step - score > rule.max_idle_steps
        if rule.max_idle_seconds is not None:
            last = score if code == ref.TIMESTAMP else stamp
            stale |= now - last > rule.max_idle_seconds * 1e9
        if rule.min_count is not None:
            if code in ref.DECAYED:  # count 2 ** ((L / 2**16 - step) / H) below c
                stale |= score / 2**16 < step + h.oracle.half_life * math.log2(rule.min_count)
            else:
                stale |= score < rule.min_count
        if rule.min_score is not None:
            stale |= score < rule.min_score
        if rule.min_norm is not None:
            stale |= (
                float(np.linalg.norm(np.asarray(row[: h.table.dim], np.float64))) < rule.min_norm
            )
        if stale:
            out.add(key)
    return out


def stored(h: Harness) -> dict:
    keys, values, scores, _ = h.table.export_batch(0, h.table.capacity(), include_extra=True)
    return {k: (v, s) for k, v, s in zip(keys.tolist(), values, scores.tolist())}


def agree(h: Harness) -> None:
    got = stored(h)
    assert set(got) == set(h.oracle.entries)
    for k, (row, score) in got.items():
        assert ref.isclose_rows(row, h.oracle.entries[k][0]), f"row of key {k}"
        if h.code != ref.NO_EVICTION:
            assert score == h.oracle.entries[k][1], f"score of key {k}"


def fill(h: Harness, rng, rounds=12, n=40) -> None:
    for _ in range(rounds):
        keys = torch.from_numpy(rng.integers(0, 300, n)).unique()
        h.find_or_insert(keys, rng)


CASES = [
    ("step", EvictionRule(max_idle_steps=4)),
    ("timestamp", EvictionRule(max_idle_seconds=30e-9)),  # the harness clock ticks 7 ns
    ("timestamp_lfu", EvictionRule(max_idle_seconds=40e-9, min_count=3)),
    ("timestamp_decayed_lfu", EvictionRule(max_idle_seconds=60e-9)),
    ("lfu", EvictionRule(min_count=3)),
    ("lfu", EvictionRule(min_count=2.5)),
    ("decayed_lfu", EvictionRule(min_count=0.7)),
    ("timestamp_decayed_lfu", EvictionRule(min_count=1.2)),
    ("customized", EvictionRule(min_score=20)),
    ("step", EvictionRule(min_norm=0.1)),
    ("lfu", EvictionRule(min_norm=0.1, min_count=2)),
]


@pytest.mark.parametrize("strategy, rule", CASES)
@pytest.mark.parametrize("chunk", [None, 3])
def test_rule_erases_what_the_oracle_says_is_stale(strategy, rule, chunk):
    rng = np.random.default_rng(5)
    h = Harness(strategy)
    fill(h, rng)
    agree(h)
    th = h.table.rule_thresholds(rule)  # one clock read: the pass's
    want = oracle_stale(h, rule, th.step, th.now)
    assert 0 < len(want) < len(h.oracle.entries), "the case must erase some keys, not all"
    if chunk is None:
        erased, buckets = h.table.erase_stale_buckets(th, 0, BIG)
    else:  # bounded chunks: the same keys in the end
        parts, begin, buckets = [], 0, h.table.num_buckets
        while begin < buckets:
            keys, buckets = h.table.erase_stale_buckets(th, begin, begin + chunk)
            parts.append(keys)
            begin += chunk
        erased = torch.cat(parts)
    assert buckets == h.table.num_buckets
    assert sorted(erased.tolist()) == sorted(want)
    h.oracle.erase(sorted(want))
    agree(h)
    assert h.table.size() == len(h.oracle.entries)
    # Training goes on against the oracle after the erase.
    fill(h, rng, rounds=3)
    agree(h)


def test_keys_of_a_batch_in_flight_are_kept():
    rng = np.random.default_rng(1)
    h = Harness("step")
    fill(h, rng)
    keys = torch.tensor(sorted(h.oracle.entries)[:10])
    hold = h.table.begin_batch()  # a training forward's batch, until its backward
    h.table.find_or_insert_slots(keys, None, hold)
    h.oracle.upsert(keys.tolist())
    h.table.score_step += 2  # later steps (of other tables' keys, say): every key is stale
    th = h.table.rule_thresholds(EvictionRule(max_idle_steps=0))
    erased, _ = h.table.erase_stale_buckets(th, 0, BIG)
    # Every key but the pinned ones goes.
    want = set(h.oracle.entries) - set(keys.tolist())
    assert set(erased.tolist()) == want
    assert set(stored(h)) == set(keys.tolist())
    h.table.end_batch(hold)  # nothing in flight now: they go too
    th = h.table.rule_thresholds(EvictionRule(max_idle_steps=0))
    erased, _ = h.table.erase_stale_buckets(th, 0, BIG)
    assert set(erased.tolist()) == set(keys.tolist()) and h.table.size() == 0


@pytest.mark.parametrize(
    "strategy, rule, text",
    [
        ("lfu", EvictionRule(max_idle_steps=3), "max_idle_steps=3 needs a STEP table"),
        ("step", EvictionRule(max_idle_seconds=1.0), "needs a last-access time"),
        ("customized", EvictionRule(min_count=2), "min_count=2 needs a count"),
        ("no_eviction", EvictionRule(min_norm=1.0), "keeps scores and pins"),
    ],
)
def test_a_rule_the_strategy_cannot_decide_is_refused(strategy, rule, text):
    h = Harness(strategy)
    with pytest.raises(ValueError, match=text):
        h.table.rule_thresholds(rule)


@pytest.mark.parametrize(
    "kw, error, text",
    [
        ({}, ValueError, "set at least one of"),
        ({"max_idle_steps": -1}, ValueError, "max_idle_steps must be >= 0, got -1"),
        ({"max_idle_steps": 1.5}, TypeError, "max_idle_steps must be int"),
        ({"min_norm": float("nan")}, ValueError, "min_norm must be finite"),
        ({"min_count": 1, "buckets_per_step": 0}, ValueError, "buckets_per_step must be >= 1"),
        (
            {"min_count": 1, "load_factor_above": 1.5},
            ValueError,
            r"load_factor_above must be in \(0, 1\]",
        ),
        ({"min_count": 1, "every_n_steps": True}, TypeError, "every_n_steps must be int"),
    ],
)
def test_bad_rules_are_refused_naming_the_field(kw, error, text):
    with pytest.raises(error, match=text):
        EvictionRule(**kw)
