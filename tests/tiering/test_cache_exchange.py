"""table_cache_exchange (core/tier_ops.h), the row moves of a cache fill, against a
plain-Python account of what it must do: where a key's claim evicted a resident, that
resident leaves with the slot's row and user score (in key order); then every key
that took a slot (INSERTED or EVICTED) gets there the slow table's row and score, or
the initial row of the table's initializer and score 0; hits and failed keys are left
alone."""

import numpy as np
import pytest
import torch

import dynemb
from dynemb import DynamicEmbInitializerArgs, DynamicEmbInitializerMode, _ops
from dynemb.types import DynamicEmbScoreStrategy

DIM, EXTRA = 8, 3
INIT = DynamicEmbInitializerArgs(mode=DynamicEmbInitializerMode.UNIFORM, lower=-0.5, upper=0.5)


def _tables(slots: int, dtype=torch.float32):
    cache = dynemb.ScoredHashTable(
        dim=DIM, capacity=slots, bucket_capacity=64, extra_columns=EXTRA,
        score_strategy=DynamicEmbScoreStrategy.STEP, initializer=INIT, seed=11,
        value_dtype=dtype, extra_init=0.25,
    )  # fmt: skip
    slow = dynemb.ScoredHashTable(
        dim=DIM, capacity=4 * slots, bucket_capacity=64, extra_columns=EXTRA,
        score_strategy=DynamicEmbScoreStrategy.CUSTOMIZED, value_dtype=dtype,
    )  # fmt: skip
    return cache, slow


@pytest.mark.parametrize("counted", [False, True], ids=["op-counts", "claim-counts"])
@pytest.mark.parametrize("n", [40, 6000])  # 6000 > 2 * kGrain: both threads take part
def test_victims_out_then_entries_in(n, counted):
    """``counted``: the caller passes the claim's counts (moved, victims), which a CUDA
    executor trusts instead of reading the device; the same moves either way."""
    rng = np.random.default_rng(n)
    cache, slow = _tables(2 * n)
    c = cache.buffers
    c.values.copy_(torch.from_numpy(rng.standard_normal(tuple(c.values.shape)).astype(np.float32)))
    user_scores = torch.from_numpy(rng.integers(1, 10**9, c.values.shape[0]))
    keys = torch.from_numpy(rng.choice(2**62, size=n, replace=False)).to(torch.int64) - 2**61
    stored = torch.from_numpy(rng.random(n) < 0.5)
    slow_rows = torch.randn(int(stored.sum()), DIM + EXTRA)
    slow_scores = torch.from_numpy(rng.integers(1, 10**6, int(stored.sum())))
    slow.insert_or_assign(keys[stored], slow_rows, scores=slow_scores)
    slots = torch.from_numpy(rng.choice(c.values.shape[0], size=n, replace=False))
    S = _ops.Status
    status = torch.from_numpy(rng.choice([S.HIT, S.INSERTED, S.EVICTED, S.FAILED], n, p=[0.2, 0.25, 0.45, 0.1])).to(torch.int8)  # fmt: skip
    slots[status == S.FAILED] = -1
    evicted = status == S.EVICTED
    moved = evicted | (status == S.INSERTED)
    evicted_keys = torch.from_numpy(rng.integers(-(2**62), 2**62, n))
    rows_before, scores_before = c.values.clone(), user_scores.clone()

    counts = (int(moved.sum()), int(evicted.sum())) if counted else (-1, -1)
    victim_keys, victim_rows, victim_scores, found = _ops.table_cache_exchange(
        c.tensors(), slow.buffers.tensors(), cache.state.init, cache.seed, DIM,
        user_scores, keys, slots, status, evicted_keys, *counts,
    )  # fmt: skip

    assert torch.equal(victim_keys, evicted_keys[evicted])
    assert torch.equal(victim_rows, rows_before[slots[evicted]])
    assert torch.equal(victim_scores, scores_before[slots[evicted]])
    assert torch.equal(found, stored & moved)
    at = slots[stored & moved]
    assert torch.equal(c.values[at], slow_rows[moved[stored]])
    assert torch.equal(user_scores[at], slow_scores[moved[stored]])
    fresh = ~stored & moved
    new = slots[fresh]
    initial = _ops.embedding_gather(
        c.tensors(),
        torch.full_like(keys[fresh], -1),
        keys[fresh],
        cache.state.init,
        cache.seed,
        DIM,
    )
    assert torch.equal(c.values[new, :DIM], initial)
    assert bool((c.values[new, DIM:] == 0.25).all())
    assert bool((user_scores[new] == 0).all())
    untouched = torch.ones(c.values.shape[0], dtype=torch.bool)
    untouched[slots[moved]] = False  # hits' slots included: they stay as they were
    assert torch.equal(c.values[untouched], rows_before[untouched])
    assert torch.equal(user_scores[untouched], scores_before[untouched])


def test_half_precision_rows_move_bit_for_bit():
    cache, slow = _tables(64, torch.float16)
    keys = torch.arange(1, 33, dtype=torch.int64)
    rows = torch.randn(32, DIM + EXTRA).half()
    slow.insert_or_assign(keys, rows, scores=torch.arange(32, dtype=torch.int64) + 1)
    slots = torch.arange(32, dtype=torch.int64) * 2
    user_scores = torch.zeros(cache.buffers.values.shape[0], dtype=torch.int64)
    status = torch.full((32,), _ops.Status.INSERTED, dtype=torch.int8)
    victim_keys, _, _, found = _ops.table_cache_exchange(
        cache.buffers.tensors(), slow.buffers.tensors(), cache.state.init, cache.seed, DIM,
        user_scores, keys, slots, status, keys,
    )  # fmt: skip
    assert bool(found.all()) and victim_keys.numel() == 0
    assert torch.equal(cache.buffers.values[slots], rows)


def _call(cache, slow, user_scores=None, keys=None, slots=None, status=None, counts=(-1, -1)):
    n = cache.buffers.values.shape[0]
    keys = torch.tensor([5, 6]) if keys is None else keys
    S = _ops.Status
    return _ops.table_cache_exchange(
        cache.buffers.tensors(), slow.buffers.tensors(), cache.state.init, cache.seed, DIM,
        torch.zeros(n, dtype=torch.int64) if user_scores is None else user_scores,
        keys, torch.tensor([0, 1]) if slots is None else slots,
        torch.tensor([S.EVICTED, S.INSERTED], dtype=torch.int8) if status is None else status,
        torch.tensor([7, 8]), *counts,
    )  # fmt: skip


def test_bad_arguments_are_named_and_change_nothing():
    cache, slow = _tables(64)
    n = cache.buffers.values.shape[0]
    before = cache.buffers.values.clone()
    with pytest.raises(ValueError, match="`slots` must hold slots in \\[-1, "):
        _call(cache, slow, slots=torch.tensor([0, n]))
    with pytest.raises(ValueError, match="`slots` must hold slots in \\[-1, .*got values in \\[-2"):
        _call(cache, slow, slots=torch.tensor([-2, 0]))
    with pytest.raises(ValueError, match="1 keys whose `status` moves them in have slot -1"):
        _call(cache, slow, slots=torch.tensor([-1, 0]))
    with pytest.raises(TypeError, match="status"):
        _call(cache, slow, status=torch.tensor([1, 0]))
    with pytest.raises(
        ValueError, match=f"`user_scores` must be .* shape \\({n}\\).*got Long of shape \\[3\\]"
    ):
        _call(cache, slow, user_scores=torch.zeros(3, dtype=torch.int64))
    with pytest.raises(ValueError, match="`user_scores` must be .*got Int"):
        _call(cache, slow, user_scores=torch.zeros(n, dtype=torch.int32))
    with pytest.raises(ValueError, match="need one element per key \\(2\\), got 1"):
        _call(cache, slow, slots=torch.tensor([0]))
    other = dynemb.ScoredHashTable(
        dim=DIM, capacity=256, bucket_capacity=64, extra_columns=EXTRA + 1,
        score_strategy=DynamicEmbScoreStrategy.CUSTOMIZED,
    )  # fmt: skip
    with pytest.raises(ValueError, match="same row layout"):
        _call(cache, other)
    assert torch.equal(cache.buffers.values, before)


def test_counts_out_of_range_are_named_and_change_nothing():
    cache, slow = _tables(64)
    before = cache.buffers.values.clone()
    for counts in [(-1, 0), (0, -1), (3, 1), (1, 2)]:
        with pytest.raises(ValueError, match="`moved` and `victims` must both be -1, or counts"):
            _call(cache, slow, counts=counts)
    assert torch.equal(cache.buffers.values, before)


def test_counts_that_are_not_the_claims_refused_or_bounded():
    """The CPU executor checks the caller's counts against ``status`` before any
    change; a CUDA executor trusts them (no read), and its own counts bound what it
    reads and writes: a moved count too large moves only the keys that move, one too
    small leaves the rest undone, and no victim is written past the outputs."""
    cache, slow = _tables(64)
    before = cache.buffers.values.clone()
    S = _ops.Status
    one_moves = torch.tensor([S.EVICTED, S.HIT], dtype=torch.int8)  # the truth: 1 and 1
    if dynemb.executor() == "cpu":
        for counts in [(2, 0), (1, 1), (2, 2)]:  # the truth: 2 move in, 1 evicts
            with pytest.raises(ValueError, match="must be the counts of `status`: 2 keys move in, 1"):  # fmt: skip
                _call(cache, slow, counts=counts)
        with pytest.raises(ValueError, match="must be the counts of `status`: 1 keys move in, 1"):
            _call(cache, slow, status=one_moves, counts=(2, 1))
        assert torch.equal(cache.buffers.values, before)
        return
    fresh, _ = _tables(64)
    keys, _, _, found = _call(cache, slow, status=one_moves, counts=(2, 1))  # moved too many
    assert keys.tolist() == [7] and found.tolist() == [False, False]
    assert torch.equal(cache.buffers.values[1], fresh.buffers.values[1])  # the hit untouched
    cache, slow = _tables(64)
    keys, _, _, found = _call(cache, slow, counts=(2, 0))  # victims too few: none written
    assert keys.numel() == 0 and found.tolist() == [False, False]
    assert not torch.equal(cache.buffers.values[:2], before[:2])  # both keys moved in
    cache, slow = _tables(64)
    keys, _, _, found = _call(cache, slow, counts=(1, 1))  # only the first key moves
    assert keys.tolist() == [7] and found.tolist() == [False, False]
    cache2, _ = _tables(64)
    assert torch.equal(cache.buffers.values[1], cache2.buffers.values[1])  # slot 1 untouched


def test_given_counts_read_nothing_of_the_device():
    """On a CUDA executor the op reads its move counts from the device unless the
    caller gives them (the emulated executor counts its ops' reads); the CPU executor
    reads no device either way."""
    from dynemb._host_reads import host_reads

    cache, slow = _tables(64)
    reads = []
    for counts in [(-1, -1), (2, 1)]:
        start = host_reads()
        _call(cache, slow, counts=counts)
        reads.append(host_reads() - start)
    assert reads == ([0, 0] if dynemb.executor() == "cpu" else [1, 0])


def _compound_slow(slots: int):
    return dynemb.ScoredHashTable(
        dim=DIM, capacity=4 * slots, bucket_capacity=64, extra_columns=EXTRA,
        score_strategy=(DynamicEmbScoreStrategy.TIMESTAMP, DynamicEmbScoreStrategy.LFU),
    )  # fmt: skip


def test_compound_entries_move_with_their_timestamps():
    """A slow table that keeps timestamps: user_scores is (slots, 2), (score, time); a
    victim leaves with both, a fetched key takes the slow table's both, a new key 0, 0."""
    rng = np.random.default_rng(3)
    n = 300
    cache, _ = _tables(2 * n)
    slow = _compound_slow(2 * n)
    c = cache.buffers
    user = torch.from_numpy(rng.integers(1, 10**9, (c.values.shape[0], 2)))
    keys = torch.from_numpy(rng.choice(2**40, size=n, replace=False)).to(torch.int64)
    stored = torch.from_numpy(rng.random(n) < 0.5)
    m = int(stored.sum())
    slow_scores = torch.from_numpy(rng.integers(1, 10**6, m))
    slow_times = torch.from_numpy(rng.integers(1, 10**12, m))
    slow.restore(keys[stored], torch.randn(m, DIM), torch.randn(m, EXTRA), slow_scores, slow_times)
    slots = torch.from_numpy(rng.choice(c.values.shape[0], size=n, replace=False))
    S = _ops.Status
    status = torch.from_numpy(rng.choice([S.HIT, S.INSERTED, S.EVICTED], n)).to(torch.int8)
    evicted, moved = status == S.EVICTED, status != S.HIT
    before = user.clone()
    victim_keys, _, victim_scores, found = _ops.table_cache_exchange(
        c.tensors(), slow.buffers.tensors(), cache.state.init, cache.seed, DIM, user, keys,
        slots, status, keys + 1,
    )  # fmt: skip
    assert torch.equal(victim_keys, keys[evicted] + 1)
    assert torch.equal(victim_scores, before[slots[evicted]])  # (v, 2): score and time
    assert torch.equal(found, stored & moved)
    fetched = slots[stored & moved]
    assert torch.equal(user[fetched, 0], slow_scores[moved[stored]])
    assert torch.equal(user[fetched, 1], slow_times[moved[stored]])
    assert bool((user[slots[~stored & moved]] == 0).all())
    assert torch.equal(user[slots[~moved]], before[slots[~moved]])


def test_score_columns_must_match_the_slow_table():
    """One column against a slow table that keeps timestamps would drop them, two
    against one that does not would invent them: both refused, naming the shape."""
    cache, slow = _tables(64)
    n = cache.buffers.values.shape[0]
    before = cache.buffers.values.clone()
    with pytest.raises(ValueError, match=f"shape \\({n}, 2\\) \\(score, timestamp"):
        _call(cache, _compound_slow(64))
    with pytest.raises(ValueError, match=f"shape \\({n}\\), one entry"):
        _call(cache, slow, user_scores=torch.zeros((n, 2), dtype=torch.int64))
    assert torch.equal(cache.buffers.values, before)
