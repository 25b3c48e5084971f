"""The eviction floor (UpsertArgs::evict_below) against the dict oracle.

A full bucket may evict its minimum (score, digest, key) resident only when that score is
below the floor; otherwise the newcomer fails and nothing changes. The cache tier
uses it to pin the rows of batches in flight.
"""

import numpy as np
import pytest
import torch

import dynemb
from dynemb import DynamicEmbScoreStrategy, _ops
from tests.support import reference as ref


def _step_table_and_oracle(dim, cap=64, bc=16):
    """A STEP table and its oracle, whose new rows are zeros (the ops' rows here)."""
    table = dynemb.ScoredHashTable(
        dim=dim, capacity=cap, bucket_capacity=bc, score_strategy=DynamicEmbScoreStrategy.STEP
    )
    oracle = ref.ReferenceTable(dim, cap, cap, bc, ref.STEP, init=(2, -0.1, 0.1))
    oracle._new_row = lambda key: np.zeros(dim, dtype=np.float32)
    return table, oracle


@pytest.mark.parametrize("seed", [0, 1])
def test_floor_matches_oracle(seed):
    rng = np.random.default_rng(seed)
    dim = 4
    table, oracle = _step_table_and_oracle(dim)
    failures = evictions = 0
    for batch in range(1, 13):
        keys = torch.from_numpy(rng.choice(2**40, size=40, replace=False)).to(torch.int64)
        values = torch.from_numpy(rng.standard_normal((40, dim)).astype(np.float32))
        floor = int(rng.integers(0, batch + 1)) if batch > 4 else _ops.EVICT_ANY
        # Pin number = batch: each batch pins its own keys, as a table's owner does.
        policy = _ops.Policy(DynamicEmbScoreStrategy.STEP.value, batch, 0, floor, dim, batch, batch)
        evicted = [
            torch.empty(40, dtype=torch.int64),
            torch.empty(40, dim),
            torch.empty(40, dtype=torch.int64),
        ]
        status, _ = _ops.table_insert_or_assign(
            table.buffers.tensors(), policy, table.state.init, keys, None, values, evicted
        )
        want, want_evicted = oracle.upsert(
            keys.tolist(), None, values.numpy(), evict_below=None if floor < 0 else floor
        )
        assert status.tolist() == want
        for i, (k, row, score) in want_evicted.items():
            assert int(evicted[0][i]) == k and int(evicted[2][i]) == score
            assert ref.isclose_rows(evicted[1][i], row)
        failures += want.count(ref.FAILED)
        evictions += want.count(ref.EVICTED)
        if floor == 0:
            assert ref.EVICTED not in want  # floor 0 never evicts
    assert failures > 0 and evictions > 0  # both branches were exercised
    slots = _ops.table_find_slots(table.buffers.tensors(), torch.tensor(sorted(oracle.entries)))
    assert bool((slots >= 0).all())
    assert int((table.buffers.digests.view(-1) != 0).sum()) == len(oracle.entries)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_cache_scores_evict_the_least_used_unpinned_resident(seed):
    """A cache tier's own score (uses since the key entered, then its latest batch):
    a full bucket evicts the resident used by the fewest batches, the oldest among
    equals, never one pinned by a batch at or above the floor, however rarely used;
    against the oracle, statuses, victims and every stored score."""
    rng = np.random.default_rng(seed)
    dim = 4
    table, oracle = _step_table_and_oracle(dim, cap=32)
    oracle.strategy = ref.CACHE
    pool = rng.choice(2**40, size=120, replace=False)  # keys come back: uses grow
    failures = evictions = pinned_skips = 0
    for batch in range(1, 40):
        keys = torch.from_numpy(rng.choice(pool, size=12, replace=False)).to(torch.int64)
        values = torch.from_numpy(rng.standard_normal((12, dim)).astype(np.float32))
        floor = int(rng.integers(max(1, batch - 3), batch + 1)) if batch > 3 else _ops.EVICT_ANY
        before = {k: e[1] for k, e in oracle.entries.items()}
        evicted = [torch.empty(12, dtype=torch.int64), torch.empty(12, dim), torch.empty(12, dtype=torch.int64)]  # fmt: skip
        status, _ = _ops.table_insert_or_assign(
            table.buffers.tensors(), _ops.Policy(ref.CACHE, batch, 0, floor, dim, batch, batch),
            table.state.init, keys, None, values, evicted,
        )  # fmt: skip
        want, want_evicted = oracle.upsert(
            keys.tolist(), None, values.numpy(), batch_value=batch,
            evict_below=None if floor < 0 else floor,
        )  # fmt: skip
        assert status.tolist() == want
        for i, (k, _, score) in want_evicted.items():
            assert int(evicted[0][i]) == k and int(evicted[2][i]) == score
            assert floor < 0 or score & ref.CACHE_BATCH_MASK < floor  # never a pinned one
            # a pinned resident used less often stayed: the floor, not the count, spared it
            pinned_skips += any(
                s & ref.CACHE_BATCH_MASK >= floor and s >> 32 < score >> 32
                for k2, s in before.items()
                if k2 in oracle.entries and oracle._home(k2) == oracle._home(k)
            )
        failures += want.count(ref.FAILED)
        evictions += want.count(ref.EVICTED)
    assert failures > 0 and evictions > 0 and pinned_skips > 0  # every branch exercised
    keys = torch.tensor(sorted(oracle.entries))
    slots = _ops.table_find_slots(table.buffers.tensors(), keys)
    assert bool((slots >= 0).all())
    stored = table.buffers.scores.view(-1)[slots].tolist()
    assert stored == [oracle.entries[k][1] for k in keys.tolist()]
    assert max(s >> 32 for s in stored) > 1  # some keys counted several batches
    with pytest.raises(ValueError, match="batch number and floor must be in \\[0, 2\\^32\\)"):
        _ops.table_insert_or_assign(
            table.buffers.tensors(), _ops.Policy(ref.CACHE, 2**32, 0, 1, dim), table.state.init, keys, None,
            torch.zeros(keys.numel(), dim), [],
        )  # fmt: skip


@pytest.mark.parametrize("seed", [0, 1])
def test_slot_claims_leave_rows_and_report_victims(seed):
    """find_or_insert_slots(init_rows=False): the oracle's statuses and victims; a
    claimed slot still holds its evicted resident's row (the cache fill moves it)."""
    rng = np.random.default_rng(seed)
    dim = 4
    table, oracle = _step_table_and_oracle(dim)
    s = table.buffers
    evictions = 0
    for batch in range(1, 10):
        keys = torch.from_numpy(rng.choice(2**40, size=40, replace=False)).to(torch.int64)
        floor = int(rng.integers(0, batch + 1)) if batch > 4 else _ops.EVICT_ANY
        # Pin number = batch: each batch pins its own keys, as a table's owner does.
        policy = _ops.Policy(DynamicEmbScoreStrategy.STEP.value, batch, 0, floor, dim, batch, batch)
        before = {
            int(k): s.values[i].clone() for i, k in enumerate(s.keys) if s.digests.view(-1)[i]
        }
        evicted_keys = torch.full_like(keys, -7)
        slots, status, _ = _ops.table_find_or_insert_slots(
            s.tensors(), policy, table.state.init, keys, None, None,
            init_rows=False, evicted_keys=evicted_keys,
        )  # fmt: skip
        want, want_evicted = oracle.upsert(
            keys.tolist(), None, np.zeros((40, dim), np.float32),
            evict_below=None if floor < 0 else floor,
        )  # fmt: skip
        assert status.tolist() == want
        for i, st in enumerate(want):
            if st == ref.EVICTED:
                victim = want_evicted[i][0]
                assert int(evicted_keys[i]) == victim
                assert torch.equal(s.values[slots[i]], before[victim])  # row left in place
                evictions += 1
            else:
                assert int(evicted_keys[i]) == -7  # written only where a key was evicted
            if st == ref.FAILED:
                assert int(slots[i]) == -1
        s.values[slots[slots >= 0]] = 0  # the caller's rows (the oracle's new rows)
    assert evictions > 0


@pytest.mark.parametrize("pin", [0, 5])
def test_hits_first_keeps_the_batch_own_keys(pin):
    """A full bucket; the batch [new key, the bucket's next victim]: the victim, a
    hit, is touched (and pinned) before the new key is placed, whatever the batch
    order, so another resident leaves instead of coming back as a new key (with or
    without pins: hits are placed first under every evicting strategy)."""
    table = dynemb.ScoredHashTable(
        dim=2, capacity=16, bucket_capacity=16, score_strategy=DynamicEmbScoreStrategy.STEP
    )
    s = table.buffers
    residents = torch.arange(100, 116, dtype=torch.int64)
    policy = _ops.Policy(DynamicEmbScoreStrategy.STEP.value, 1, 0, _ops.EVICT_ANY, 2)
    _ops.table_find_or_insert_slots(s.tensors(), policy, table.state.init, residents, None)
    # All scored 1: the smallest (digest, key) goes first, then the next.
    victim, second = sorted(residents.tolist(), key=lambda k: (ref.digest_of(k), k))[:2]
    batch = torch.tensor([7, victim])
    evicted = torch.full_like(batch, -1)
    floor = pin if pin else _ops.NO_PINS
    policy = policy._replace(batch_value=2, pin=pin, pin_floor=floor)
    _, status, counts = _ops.table_find_or_insert_slots(
        s.tensors(), policy, table.state.init, batch, None, None, evicted_keys=evicted
    )  # fmt: skip
    assert status.tolist() == [_ops.Status.EVICTED, _ops.Status.HIT]
    assert evicted.tolist() == [second, -1]
    assert counts.tolist()[_ops.Status.HIT] == 1


def test_pinned_bucket_fails_new_keys():
    """A bucket whose residents all carry a pin at or above the floor takes no new
    key: it fails (reported), and no resident is evicted."""
    table = dynemb.ScoredHashTable(
        dim=2, capacity=16, bucket_capacity=16, score_strategy=DynamicEmbScoreStrategy.LFU
    )
    s = table.buffers
    residents = torch.arange(100, 116, dtype=torch.int64)
    policy = _ops.Policy(DynamicEmbScoreStrategy.LFU.value, 0, 0, _ops.EVICT_ANY, 2, 3, 3)
    _ops.table_find_or_insert_slots(s.tensors(), policy, table.state.init, residents, None)
    assert s.pins.tolist() == [3] * 16
    evicted = torch.full((2,), -1)
    _, status, _ = _ops.table_find_or_insert_slots(
        s.tensors(), policy._replace(pin=4), table.state.init, torch.tensor([7, 8]), None, None,
        evicted_keys=evicted,
    )  # fmt: skip
    assert status.tolist() == [_ops.Status.FAILED] * 2 and evicted.tolist() == [-1, -1]
    # The floor past the residents' pin: they may go again.
    _, status, _ = _ops.table_find_or_insert_slots(
        s.tensors(), policy._replace(pin=5, pin_floor=4), table.state.init, torch.tensor([7]), None,
        None, evicted_keys=evicted[:1],
    )  # fmt: skip
    assert status.tolist() == [_ops.Status.EVICTED] and int(evicted[0]) in residents.tolist()
