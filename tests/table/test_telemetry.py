"""A table's TableTelemetry against the dict-based oracle (tests/support/reference.py).

Random batches of find_or_insert and insert_or_assign (repeated keys, keys of
earlier batches, growth, evictions, failures) replayed through ScoredHashTable and
ReferenceTable: every step's counts (hits, inserted, evicted, failed, size,
capacity) and the totals are the oracle's, exactly; on sampled steps each evicted
resident's score, age (steps or seconds since its last access) and rank among the
scores stored at the start of its step are the oracle's too. A hand-built bucket
gives the ages by hand; the bucket fill is checked against a count of the oracle's
home buckets; a table larger than the rank's reference slots estimates ranks within
0.02 of the exact ones.
"""

import collections
import copy
import gc
import itertools
import weakref

import numpy as np
import pytest
import torch

import dynemb
from dynemb import DynamicEmbScoreStrategy as S
from dynemb.table.rw_lock import RWLock
from dynemb.table.upsert_counts import StepCounts
from tests.support import reference as ref

STRATEGIES = {
    "timestamp": (S.TIMESTAMP, ref.TIMESTAMP),
    "step": (S.STEP, ref.STEP),
    "lfu": (S.LFU, ref.LFU),
    "timestamp_lfu": ((S.TIMESTAMP, S.LFU), ref.TIMESTAMP_LFU),
    "decayed_lfu": (S.DECAYED_LFU, ref.DECAYED_LFU),
    "timestamp_decayed_lfu": ((S.TIMESTAMP, S.DECAYED_LFU), ref.TIMESTAMP_DECAYED_LFU),
    "no_eviction": (S.NO_EVICTION, ref.NO_EVICTION),
}
HALF_LIFE = 3
AGE_UNITS = {ref.STEP: "steps", ref.TIMESTAMP: "seconds", ref.TIMESTAMP_LFU: "seconds",
             ref.TIMESTAMP_DECAYED_LFU: "seconds"}  # fmt: skip


class Replay:
    """A table and its oracle fed the same batches, with a clock both read."""

    def __init__(self, name, device, capacity=128, init_capacity=32, bc=16, sample_every=1):
        strategy, self.code = STRATEGIES[name]
        half_life = HALF_LIFE if self.code in ref.DECAYED else None
        self.table = dynemb.ScoredHashTable(
            dim=4, capacity=capacity, init_capacity=init_capacity, bucket_capacity=bc,
            score_strategy=strategy, score_half_life_steps=half_life, device=device,
        )  # fmt: skip
        self.table.telemetry.configure(sample_every=sample_every)
        self.oracle = ref.ReferenceTable(4, capacity, init_capacity, bc, self.code,
                                         half_life=half_life)  # fmt: skip
        clock = itertools.count(10**9, 7 * 10**8)
        self.now = None

        def tick():
            self.now = next(clock)
            return self.now

        self.table.state.clock = tick
        self.evictions = []  # (score, age or None, rank) of the oracle's evictions
        self.steps = []  # the oracle's StepCounts

    def step(self, keys: torch.Tensor, assign: bool) -> None:
        before = {k: (e[1], e[2]) for k, e in self.oracle.entries.items()}
        capacity = self.table.capacity()
        if assign:
            self.table.insert_or_assign(keys, torch.ones(keys.numel(), 4, device=keys.device))
        else:
            self.table.find_or_insert(keys)
        status, evicted = self.oracle.upsert(keys.tolist(), batch_value=self.now)
        counts = [status.count(s) for s in range(4)]
        if self.code == ref.NO_EVICTION:  # placement is not modelled: reconcile failures
            failed = self.table.last_stats.failed_keys.tolist()
            for k in failed:
                assert ref.window_full(self.table, k), f"key {k} failed with room left"
                self.oracle.drop(k)
            for k, st in zip(keys.tolist(), status):  # each occurrence of them failed
                if k in failed:
                    counts[st] -= 1
                    counts[ref.FAILED] += 1
        size, cap = len(self.oracle.entries), self.oracle.capacity()
        if self.code == ref.NO_EVICTION:  # the oracle does not grow it: windows fill first
            cap = self.table.capacity()
        self.steps.append(StepCounts(self.oracle.step, *counts, size, cap))
        if self.table.capacity() != capacity:
            return  # a step that grew the table is not sampled
        for pos in sorted(evicted):
            score, stamp = before[evicted[pos][0]]
            batch = self.oracle.step if self.code == ref.STEP else self.now
            age = None  # the strategy keeps no last access
            if self.code in (ref.STEP, ref.TIMESTAMP):
                age = batch - score
            elif self.code in ref.STAMPED:
                age = batch - stamp
            rank = sum(1 for s, _ in before.values() if s < score) / len(before)
            self.evictions.append((score, age, rank))


def _keys(rng, seen: list, n: int, device) -> torch.Tensor:
    fresh = rng.integers(-(2**63), 2**63 - 1, size=n, dtype=np.int64).tolist()
    picks = [seen[rng.integers(len(seen))] if seen and rng.random() < 0.4 else k for k in fresh]
    picks += picks[: int(rng.integers(0, 4))]  # repeats within the batch
    seen.extend(picks)
    return torch.tensor(picks, dtype=torch.int64, device=device)


@pytest.mark.parametrize("name", list(STRATEGIES))
@pytest.mark.parametrize("seed", [0, 1])
def test_counts_and_evictions_match_the_oracle(device, name, seed):
    rng = np.random.default_rng(seed)
    r = Replay(name, device)
    seen: list[int] = []
    for _ in range(30):
        r.step(_keys(rng, seen, int(rng.integers(0, 60)), device), assign=rng.random() < 0.3)
        t = r.table.telemetry
        assert t.last == r.steps[-1]
        assert t.load_factor() == r.steps[-1].size / r.steps[-1].capacity
    t = r.table.telemetry
    assert list(t.recent) == r.steps[-t.window :]
    for field in ("hits", "inserted", "evicted", "failed"):
        assert getattr(t, field) == sum(getattr(s, field) for s in r.steps), field
    assert t.steps == 30
    if r.code == ref.NO_EVICTION:
        assert t.failed > 0 and t.evicted == 0  # the case is exercised
        return
    assert t.evicted > 0
    ev = t.evictions()
    assert ev.count == len(r.evictions) > 0
    assert ev.scores.tolist() == [e[0] for e in r.evictions]
    assert ev.ranks.tolist() == pytest.approx([e[2] for e in r.evictions], abs=1e-12)
    assert ev.age_unit == AGE_UNITS.get(r.code)
    if ev.age_unit is None:
        assert ev.ages is None and ev.age_p50 is None
    else:
        scale = 1e-9 if ev.age_unit == "seconds" else 1.0
        assert ev.ages.tolist() == pytest.approx([e[1] * scale for e in r.evictions])
        assert min(ev.ages.tolist()) > 0  # a key of the batch itself is never evicted
    assert ev.lowest_decile == pytest.approx(np.mean([e[2] < 0.1 for e in r.evictions]))


def _hand_built(device, strategy, clock=None):
    """One bucket of 16 slots: keys 0..15 at step 1, 0..7 again at step 2, 8..14 at
    step 3; key 15 is then the oldest and the least used."""
    table = dynemb.ScoredHashTable(dim=2, capacity=16, bucket_capacity=16,
                                   score_strategy=strategy, device=device)  # fmt: skip
    table.telemetry.configure(sample_every=1)
    if clock is not None:
        table.state.clock = clock
    for keys in (range(16), range(8), range(8, 15)):
        table.find_or_insert(torch.tensor(list(keys), device=device))
    return table


def test_evicted_ages_of_a_hand_built_bucket(device):
    table = _hand_built(device, S.STEP)  # scores: 0..7 -> 2, 8..14 -> 3, 15 -> 1
    table.find_or_insert(torch.tensor([100], device=device))  # step 4 evicts key 15
    ev = table.telemetry.evictions()
    assert (ev.ages.tolist(), ev.scores.tolist(), ev.ranks.tolist()) == ([3.0], [1], [0.0])
    table.find_or_insert(torch.tensor([200, 201], device=device))  # step 5: two of 0..7
    ev = table.telemetry.evictions()
    assert ev.ages.tolist() == [3.0, 3.0, 3.0] and ev.scores.tolist() == [1, 2, 2]
    assert ev.ranks.tolist() == [0.0, 0.0, 0.0]
    assert table.telemetry.evicted == 3 and table.telemetry.sampled_steps == 5
    assert torch.equal(table.contains(torch.tensor([15, 100], device=device)).cpu(),
                       torch.tensor([False, True]))  # fmt: skip


def test_evicted_ages_in_seconds_and_lfu_scores(device):
    times = iter([10**9, 3 * 10**9, 4 * 10**9, 9 * 10**9])  # the clock of steps 1..4
    table = _hand_built(device, S.TIMESTAMP, clock=lambda: next(times))
    table.find_or_insert(torch.tensor([100], device=device))
    ev = table.telemetry.evictions()
    assert ev.age_unit == "seconds" and ev.ages.tolist() == [8.0]  # key 15, seen at 1 s
    lfu = _hand_built(device, S.LFU)  # counts: 0..14 -> 2, 15 -> 1
    lfu.find_or_insert(torch.tensor([100], device=device))
    ev = lfu.telemetry.evictions()
    assert ev.age_unit is None and ev.ages is None and ev.scores.tolist() == [1]


def test_bucket_fill_is_a_count_of_home_buckets(device):
    table = dynemb.ScoredHashTable(dim=2, capacity=64 * 16, bucket_capacity=16, device=device,
                                   score_strategy=S.STEP)  # fmt: skip
    keys = torch.from_numpy(np.random.default_rng(3).integers(-(2**63), 2**63 - 1, 700))
    table.find_or_insert(keys.to(device))
    homes = collections.Counter(ref.bucket_of(k, 64) for k in keys.tolist())
    stored = table.size()
    per_bucket = [min(homes.get(b, 0), 16) for b in range(64)]
    assert sum(per_bucket) == stored  # full buckets evicted the rest
    fill = table.telemetry.bucket_fill()
    assert (fill.num_buckets, fill.bucket_capacity) == (64, 16)
    assert (fill.min, fill.max) == (min(per_bucket), max(per_bucket))
    assert fill.mean == pytest.approx(stored / 64)
    assert fill.std == pytest.approx(float(np.std(per_bucket)))
    assert fill.histogram.tolist() == np.bincount(per_bucket, minlength=17).tolist()
    assert (fill.empty, fill.full) == (per_bucket.count(0), per_bucket.count(16))


def test_sampling_every_k_steps_and_switching_off(device):
    table = _hand_built(device, S.STEP)
    t = table.telemetry
    t.configure(sample_every=2, window=2)
    for k in range(100, 104):  # steps 4..7: one eviction each, steps 4 and 6 sampled
        table.find_or_insert(torch.tensor([k], device=device))
    assert t.evicted == 4 and t.evictions().count == 2 and len(t.recent) == 2
    assert t.window_totals().evicted == 2
    t.configure(enabled=False)
    table.find_or_insert(torch.tensor([500], device=device))
    assert (t.steps, t.evicted) == (7, 4)  # not counted
    t.configure(enabled=True)
    t.reset()
    assert (t.steps, t.evicted, t.last, t.evictions().count) == (0, 0, None, 0)


@pytest.mark.parametrize(
    "setting, error, match",
    [
        ({"window": 0}, ValueError, r"TableTelemetry.window must be >= 1, got 0"),
        ({"sample_every": -1}, ValueError, r"sample_every must be >= 0, got -1"),
        ({"max_samples": 2.0}, TypeError, r"max_samples must be an int, got 2.0"),
        ({"enabled": 1}, TypeError, r"enabled must be a bool, got 1"),
    ],
)
def test_bad_settings_are_refused_before_any_change(setting, error, match):
    t = dynemb.ScoredHashTable(dim=2, capacity=16, bucket_capacity=16).telemetry
    with pytest.raises(error, match=match):
        t.configure(**{"sample_every": 5, **setting})
    assert (t.window, t.sample_every, t.enabled) == (100, 100, True)


def test_ranks_of_a_large_table_are_estimated_from_a_stride_of_slots(device):
    # 16,384 slots: ranks are measured against 4,096 of them (one in 4), against all
    # the stored scores here.
    table = dynemb.ScoredHashTable(dim=2, capacity=1 << 14, bucket_capacity=128, device=device,
                                   score_strategy=S.STEP)  # fmt: skip
    rng = np.random.default_rng(5)
    for _ in range(12):
        keys = rng.integers(-(2**63), 2**63 - 1, 2048, dtype=np.int64)
        table.find_or_insert(torch.from_numpy(keys).to(device))
    _, _, stored, _ = table.export_batch(0, table.capacity())
    table.telemetry.configure(sample_every=1)
    table.find_or_insert(torch.from_numpy(rng.integers(0, 2**62, 512)).to(device))
    ev = table.telemetry.evictions()
    assert ev.count == table.last_stats.evicted > 400
    exact = torch.tensor([(stored < s).double().mean().item() for s in ev.scores.tolist()])
    error = (ev.ranks - exact).abs()
    assert float(error.mean()) < 0.005 and float(error.max()) < 0.02
    assert float(exact.mean()) < 0.1  # a bucket's minimum ranks low in the table


def test_telemetry_keeps_no_deleted_table_alive_and_a_copy_counts_for_itself(device):
    table = _hand_built(device, S.STEP)
    telemetry, state = table.telemetry, weakref.ref(table.state)
    # As a deep copy of a module copies its tables (a lock cannot be copied: a new one).
    twin = copy.deepcopy(table.state, memo={id(table.state.lock): RWLock()})
    assert twin.telemetry is not telemetry and twin.telemetry.steps == telemetry.steps
    gc.disable()  # no collection may hide a reference cycle
    try:
        del table
        assert state() is None, "the telemetry kept its table alive"
    finally:
        gc.enable()
    with pytest.raises(RuntimeError, match="its table was deleted"):
        telemetry.load_factor()
    assert twin.telemetry.load_factor() == twin.size / twin.storage.num_slots
