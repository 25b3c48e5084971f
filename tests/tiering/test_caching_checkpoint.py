"""Checkpoints in caching mode: DynamicEmbDump / DynamicEmbLoad and incremental_dump
see the whole table (both tiers), exactly as an uncached run of the same training."""

import pytest
import torch

from dynemb import DynamicEmbScoreStrategy
from dynemb.checkpoint import DynamicEmbDump, DynamicEmbLoad
from dynemb.incremental_dump import get_score, incremental_dump
from dynemb.optimizer import EmbOptimType
from tests.support.caching_models import batches, check_tiers, contents, module, options, step

ADAM_STATE = 2 * 8


DECAYED = {"score_strategy": DynamicEmbScoreStrategy.DECAYED_LFU, "score_half_life_steps": 2}
STRATEGIES = {"lfu": {"score_strategy": DynamicEmbScoreStrategy.LFU}, "decayed_lfu": DECAYED}


def _pair(strategy=DynamicEmbScoreStrategy.LFU, **extra):
    plain = module([options(strategy=strategy, **extra)] * 2, EmbOptimType.ADAM)
    cached = module(
        [options(n, strategy=strategy, state=ADAM_STATE, **extra) for n in (64, 128)],
        EmbOptimType.ADAM,
    )
    return plain, cached


def _same(a, b) -> None:
    for t in range(2):
        got, want = contents(a.tables[t]), contents(b.tables[t])
        assert set(got) == set(want), f"table {t}: keys differ"
        for k in want:
            assert torch.equal(got[k][0], want[k][0]), f"table {t}: row of key {k}"
            assert got[k][1] == want[k][1], f"table {t}: score of key {k}"


@pytest.mark.parametrize("scoring", list(STRATEGIES))
def test_dump_load_every_mode(tmp_path, scoring):
    """Training in caching mode gives the uncached tables' rows and scores (LFU counts,
    DECAYED_LFU's decayed counts: a key new to the table is scored as new, one
    fetched from the storage goes on from its score), and the checkpoints of either
    load into the other."""
    plain, cached = _pair(strategy=None, **STRATEGIES[scoring])
    for b in batches(5, seed=21):
        step(plain, b), step(cached, b)
    DynamicEmbDump(tmp_path / "cached", cached, optim=True)
    DynamicEmbDump(tmp_path / "plain", plain, optim=True)
    # Cached checkpoint -> uncached table, and uncached checkpoint -> cached table
    # that already holds other (older) rows in both tiers.
    _same(cached, plain)
    into_plain, into_cached = _pair(strategy=None, **STRATEGIES[scoring])
    for b in batches(2, seed=99):
        step(into_cached, b)
    DynamicEmbLoad(tmp_path / "cached", into_plain, optim=True)
    DynamicEmbLoad(tmp_path / "plain", into_cached, optim=True)
    assert all(t.cache.size() == 0 for t in into_cached.tables)  # load empties the caches
    _same(into_plain, plain)
    # A load restores: into_cached's own rows (in both tiers) are gone.
    _same(into_cached, plain)
    # Training continues identically from the loaded tables.
    for b in batches(3, seed=22):
        torch.testing.assert_close(step(into_plain, b), step(plain, b), rtol=0, atol=1e-6)
        step(cached, b)
    _same(cached, plain)
    check_tiers(cached.tables[0], contents(plain.tables[0]))


@pytest.mark.parametrize("scoring", ["step", "decayed_lfu"])
def test_incremental_dump_sees_both_tiers(scoring):
    extra = (
        DECAYED if scoring == "decayed_lfu" else {"score_strategy": DynamicEmbScoreStrategy.STEP}
    )
    plain, cached = _pair(strategy=None, **extra)
    for b in batches(4, seed=31):
        step(plain, b), step(cached, b)
    ref_plain, ref_cached = get_score(plain), get_score(cached)
    assert ref_plain == ref_cached
    for b in batches(2, seed=32):
        step(plain, b), step(cached, b)
    got, _ = incremental_dump(cached, ref_cached, with_scores=True)
    want, _ = incremental_dump(plain, ref_plain, with_scores=True)
    assert got.keys() == want.keys()
    for coll in want:
        for name, (keys, rows, scores) in want[coll].items():
            gk, gr, gs = got[coll][name]
            order, gorder = torch.argsort(keys), torch.argsort(gk)
            assert keys.numel() > 0
            assert torch.equal(gk[gorder], keys[order])
            assert torch.equal(gr[gorder], rows[order])
            assert torch.equal(gs[gorder], scores[order])
