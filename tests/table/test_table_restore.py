"""ScoredHashTable.restore (the checkpoint load op) against the path it replaces:
insert_or_assign of the concatenated row, then the saved scores and timestamps
written by slot."""

import pytest
import torch

import dynemb
from dynemb import DynamicEmbScoreStrategy as S
from dynemb import _ops

DIM, EXTRA = 6, 5
STRATEGIES = [S.TIMESTAMP, S.STEP, S.CUSTOMIZED, S.LFU, S.NO_EVICTION, (S.TIMESTAMP, S.LFU)]


def _table(
    strategy, device, dtype=torch.float32, init_capacity=None, capacity=1 << 13, fast_rows=None
):
    t = dynemb.ScoredHashTable(
        dim=DIM,
        capacity=capacity,
        init_capacity=init_capacity,
        bucket_capacity=16,
        score_strategy=strategy,
        value_dtype=dtype,
        extra_columns=EXTRA,
        extra_init=0.25,
        device=device,
        fast_rows=fast_rows,
    )
    t.state.clock = iter(range(10**6, 10**9, 1000)).__next__
    return t


def _saved(n, dtype, device, seed):
    g = torch.Generator().manual_seed(seed)
    keys = torch.randint(-(1 << 62), 1 << 62, (n,), generator=g)
    assert keys.unique().numel() == n
    values = torch.randn(n, DIM, generator=g).to(dtype)
    state = torch.randn(n, EXTRA, generator=g).to(dtype)
    scores = torch.randint(0, 1 << 50, (n,), generator=g)
    stamps = torch.randint(0, 1 << 50, (n,), generator=g)
    return [x.to(device) for x in (keys, values, state, scores, stamps)]


def _oracle_restore(t, keys, values, state, scores, stamps):
    """The load path before table_restore existed."""
    customized = t.score_strategy == S.CUSTOMIZED
    rows = values if state is None else torch.cat([values, state], 1)
    stats = t.insert_or_assign(keys, rows, scores if customized else None)
    slots = _ops.table_find_slots(t.buffers.tensors(), keys)
    ok = slots >= 0
    if t.state.layout.keeps_scores:
        t.buffers.scores[slots[ok]] = scores[ok]
    if t.state.layout.keeps_timestamps:
        t.buffers.timestamps[slots[ok]] = stamps[ok]
    return stats


def _restore(t, keys, values, state, scores, stamps):
    return t.restore(
        keys,
        values,
        state,
        scores if t.state.layout.keeps_scores else None,
        stamps if t.state.layout.keeps_timestamps else None,
    )


def _contents(t):
    keys, rows, scores, _ = t.export_batch(0, t.capacity(), include_extra=True)
    order = torch.argsort(keys)
    keys = keys[order]
    stamps = t.get_timestamps(keys) if t.state.layout.keeps_timestamps else None
    return keys, rows[order], scores[order], stamps


def _assert_same(a, b):
    for x, y in zip(_contents(a), _contents(b), strict=True):
        assert (x is None and y is None) or torch.equal(x, y)


@pytest.mark.parametrize("strategy", STRATEGIES, ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("with_state", [True, False])
def test_restore_matches_assign_then_write_scores(device, strategy, dtype, with_state):
    """Fresh keys, keys already stored (overwritten), and growth mid-batch (retries)."""
    got, want = (_table(strategy, device, dtype, init_capacity=64) for _ in range(2))
    resident = _saved(300, dtype, device, seed=1)
    for t in (got, want):
        _oracle_restore(t, *resident)  # the same residents in both
    batch = _saved(3000, dtype, device, seed=2)
    batch = [torch.cat([r[:100], b]) for r, b in zip(resident, batch, strict=True)]  # 100 hits
    if not with_state:
        batch[2] = None
    stats = _restore(got, *batch)
    oracle = _oracle_restore(want, *batch)
    assert got.capacity() > 64, "the batch should have grown the table"
    assert (stats.hits, stats.inserted, stats.evicted, stats.failed) == (
        oracle.hits,
        oracle.inserted,
        oracle.evicted,
        oracle.failed,
    )
    assert stats.hits == 100 and stats.failed == 0
    _assert_same(got, want)
    if not with_state:  # new keys start at extra_init, residents keep their state
        keys, rows, _, _ = _contents(got)
        fresh = ~torch.isin(keys, resident[0])
        assert bool((rows[fresh, DIM:] == 0.25).all())


def test_restore_into_hybrid_tiers(device):
    """Rows past the fast tier live in the slow tier: restore writes both."""
    got, want = (_table(S.LFU, device, init_capacity=64, fast_rows=500) for _ in range(2))
    batch = _saved(3000, torch.float32, device, seed=3)
    _restore(got, *batch)
    _oracle_restore(want, *batch)
    assert got.capacity() > 500
    _assert_same(got, want)


def test_customized_admits_by_saved_score_in_a_full_bucket(device):
    t = _table(S.CUSTOMIZED, device, capacity=16)  # one bucket: every key competes
    keys = torch.arange(16, device=device)
    t.restore(keys, torch.zeros(16, DIM, device=device), scores=keys + 10)
    low = t.restore(
        torch.tensor([100], device=device),
        torch.ones(1, DIM, device=device),
        scores=torch.tensor([5], device=device),
    )
    assert low.failed == 1  # ranks below every resident: refused, nothing evicted
    high = t.restore(
        torch.tensor([200], device=device),
        torch.ones(1, DIM, device=device),
        scores=torch.tensor([99], device=device),
    )
    assert high.evicted == 1
    stored = set(t.export_batch(0, 16)[0].tolist())
    assert 200 in stored and 0 not in stored and 100 not in stored  # key 0 had the lowest score
    assert t.get_scores(torch.tensor([200], device=device)).tolist() == [99]


@pytest.mark.parametrize(
    "strategy, kwargs, error, message",
    [
        (S.CUSTOMIZED, {}, ValueError, "`scores` are required"),
        (S.NO_EVICTION, {"scores": True}, ValueError, "`scores` given"),
        (S.LFU, {"timestamps": True}, ValueError, "`timestamps` given"),
        (S.LFU, {"state": (4, EXTRA - 1)}, ValueError, r"shape \(4, 5\)"),
        (S.LFU, {"values": (4, DIM + EXTRA)}, ValueError, r"shape \(4, 6\)"),
        (S.LFU, {"scores": "int32"}, TypeError, "scores must be an int64 tensor"),
    ],
)
def test_bad_arguments_are_refused_before_any_change(device, strategy, kwargs, error, message):
    t = _table(strategy, device)
    keys = torch.arange(4, device=device)
    call = {"values": torch.zeros(4, DIM, device=device)}
    for name, spec in kwargs.items():
        if spec is True:
            call[name] = torch.zeros(4, dtype=torch.int64, device=device)
        elif spec == "int32":
            call[name] = torch.zeros(4, dtype=torch.int32, device=device)
        else:
            call[name] = torch.zeros(*spec, device=device)
    with pytest.raises(error, match=message):
        t.restore(keys, **call)
    assert t.size() == 0
