"""Caching mode with the compound scores (TIMESTAMP, LFU) and (TIMESTAMP, DECAYED_LFU):
while the slow tier does not evict, a cached table trains exactly as the uncached one.

The oracle is the uncached module on the same batches and the same clock: outputs, rows
(with optimizer state), both score columns (the count and the last-access time) and the
incremental dumps must be equal, whether keys move through the cache's evictions, the
staging area (a cache smaller than a batch) or a prefetch.
"""

import pytest
import torch

from dynemb import DynamicEmbScoreStrategy as S
from dynemb.checkpoint import DynamicEmbDump, DynamicEmbLoad
from dynemb.incremental_dump import get_score, incremental_dump
from dynemb.optimizer import EmbOptimType
from dynemb.tiering import PrefetchPipeline
from tests.support.caching_models import DIM, DictStorage, batches, check_tiers, module, options

COMPOUNDS = {
    "timestamp_lfu": {"score_strategy": (S.TIMESTAMP, S.LFU)},
    "timestamp_decayed_lfu": {
        "score_strategy": (S.TIMESTAMP, S.DECAYED_LFU),
        "score_half_life_steps": 2,
    },
}


class Clock:
    """Time moves only when the test says so (both modules read the same clock)."""

    def __init__(self) -> None:
        self.now = 1_000

    def __call__(self) -> int:
        return self.now


def _pair(compound: str, cache_rows=(64, 128), optimizer=EmbOptimType.EXACT_ADAGRAD):
    state = DIM  # Adagrad: one state column per embedding column
    extra = COMPOUNDS[compound]
    plain = module([options(strategy=None, **extra)] * 2, optimizer)
    cached = module(
        [options(n, strategy=None, state=state, **extra) for n in cache_rows], optimizer
    )
    clock = Clock()
    for t in plain.tables:
        t.state.clock = clock
    for t in cached.tables:
        t.backing_table().state.clock = clock
    return plain, cached, clock


def _step(m, batch, clock: Clock):
    clock.now += 1_000
    out = m(*batch)
    (out * torch.linspace(-1, 1, out.shape[1])).sum().backward()
    return out.detach()


def _step_both(plain, cached, batch, clock: Clock):
    """One batch through both modules at the same time: (cached output, plain output)."""
    want = _step(plain, batch, clock)
    clock.now -= 1_000
    return _step(cached, batch, clock), want


def _entries(table) -> dict:
    """{key: (row with state, score, timestamp)} of a table (the slow tier after a sync)."""
    table = table.persistent_table()
    keys, rows, scores, _ = table.export_batch(0, table.capacity(), include_extra=True)
    times = table.get_timestamps(keys)
    return {
        k: (r, s, t) for k, r, s, t in zip(keys.tolist(), rows, scores.tolist(), times.tolist())
    }


def _assert_same(cached, plain) -> None:
    for t in range(2):
        got, want = _entries(cached.tables[t]), _entries(plain.tables[t])
        assert set(got) == set(want), f"table {t}: keys differ"
        for k, (row, score, time) in want.items():
            assert torch.equal(got[k][0], row), f"table {t}: row of key {k}"
            assert got[k][1] == score, f"table {t}: score of key {k}"
            assert got[k][2] == time, f"table {t}: last-access time of key {k}"


def _assert_same_dumps(got, want) -> None:
    assert got.keys() == want.keys()
    for coll in want:
        for name, (keys, rows, times) in want[coll].items():
            gk, gr, gt = got[coll][name]
            order, gorder = torch.argsort(keys), torch.argsort(gk)
            assert torch.equal(gk[gorder], keys[order]), f"{name}: keys dumped"
            assert torch.equal(gr[gorder], rows[order]), f"{name}: rows dumped"
            assert torch.equal(gt[gorder], times[order]), f"{name}: times dumped"


@pytest.mark.parametrize("compound", list(COMPOUNDS))
@pytest.mark.parametrize("prefetch", [None, False])
def test_cached_compound_trains_like_uncached(compound, prefetch):
    plain, cached, clock = _pair(compound)
    data = batches(8, seed=41)
    want = []
    for b in data:
        want.append(_step(plain, b, clock))
    clock.now = 1_000  # the cached run sees the same times, batch by batch
    if prefetch is None:
        got = [_step(cached, b, clock) for b in data]
    else:  # inline prefetch: the prefetch of batch i runs before its forward
        got = PrefetchPipeline(
            data, lambda b: _step(cached, b, clock), lambda b: cached.prefetch(*b), overlap=prefetch
        ).run()
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=0, atol=1e-5)
    stats = cached.cache_stats()
    assert all(s.written_back > 0 and s.storage_drops == 0 for s in stats)  # rows moved
    if prefetch is None:
        assert any(s.hit_rate() < 1 for s in stats)
    else:  # every key was brought in ahead of its forward
        assert all(s.lookup_hits == s.lookup_keys for s in stats)
    for t in range(2):
        want_t = {k: (r, s) for k, (r, s, _) in _entries(plain.tables[t]).items()}
        check_tiers(cached.tables[t], want_t)
    _assert_same(cached, plain)


@pytest.mark.parametrize("compound", list(COMPOUNDS))
def test_staged_keys_keep_both_columns(compound):
    """A cache of 16 rows, smaller than a batch: keys go through the staging area."""
    plain, cached, clock = _pair(compound, cache_rows=(16, 16))
    data = batches(6, seed=13)
    for b in data:
        torch.testing.assert_close(*_step_both(plain, cached, b, clock), rtol=0, atol=1e-5)
    assert all(t.stats.staged > 0 and t.staged_keys() == 0 for t in cached.tables)
    _assert_same(cached, plain)


@pytest.mark.parametrize("compound", list(COMPOUNDS))
def test_incremental_dumps_match_uncached(compound):
    """The threshold rule per strategy: the compounds filter by last-access time."""
    plain, cached, clock = _pair(compound)
    for b in batches(4, seed=31):
        _step_both(plain, cached, b, clock)
    ref = get_score(plain)
    assert get_score(cached) == ref
    for b in batches(2, seed=32):
        _step_both(plain, cached, b, clock)
    want, current = incremental_dump(plain, ref, with_scores=True)
    got, got_current = incremental_dump(cached, ref, with_scores=True)
    assert got_current == current
    assert all(w[0].numel() for w in want["model"].values())  # the last batches' keys
    _assert_same_dumps(got, want)
    every, _ = incremental_dump(plain, 0, with_scores=True)
    every_cached, _ = incremental_dump(cached, 0, with_scores=True)
    _assert_same_dumps(every_cached, every)


@pytest.mark.parametrize("compound", list(COMPOUNDS))
def test_checkpoint_round_trip_keeps_both_columns(tmp_path, compound):
    plain, cached, clock = _pair(compound)
    for b in batches(5, seed=21):
        _step_both(plain, cached, b, clock)
    DynamicEmbDump(tmp_path / "cached", cached, optim=True)
    into_plain, into_cached, _ = _pair(compound)
    DynamicEmbLoad(tmp_path / "cached", into_plain, optim=True)
    DynamicEmbLoad(tmp_path / "cached", into_cached, optim=True)
    _assert_same(into_plain, plain)
    _assert_same(into_cached, plain)


def test_external_storage_refuses_a_compound():
    with pytest.raises(ValueError, match="external_storage=.*last-access time"):
        module([options(64, strategy=None, state=1, external_storage=DictStorage,
                        **COMPOUNDS["timestamp_lfu"])] * 2)  # fmt: skip
