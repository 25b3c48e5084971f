"""Caching mode (dynemb.tiering) against an uncached run of the same training.

The oracle is a BatchedDynamicEmbeddingTables without caching, large enough that
nothing is evicted: with caching on, the same batches must give the same outputs,
and the union of both tiers (the cache winning) the same rows, optimizer state and
scores, with every key exactly once.
"""

import pytest
import torch

from dynemb import (
    DynamicEmbScoreStrategy,
)
from dynemb.optimizer import EmbOptimType
from dynemb.tiering import PrefetchPipeline
from dynemb.tiering.factory import MIN_CACHE_ROWS
from tests.support.caching_models import (
    BATCH,
    DIM,
    DictStorage,
    assert_same_tables,
    batches,
    check_tiers,
    contents,
    contents_of_cache,
    dataclasses_tuple,
    module,
    options,
    step,
)


@pytest.mark.parametrize(
    "optimizer, prefetch",
    [
        (EmbOptimType.EXACT_ROWWISE_ADAGRAD, None),
        (EmbOptimType.EXACT_ROWWISE_ADAGRAD, True),
        (EmbOptimType.EXACT_ROWWISE_ADAGRAD, False),
        (EmbOptimType.ADAM, True),
    ],
)
def test_training_matches_uncached(optimizer, prefetch):
    data = batches(8)
    state = {EmbOptimType.EXACT_ROWWISE_ADAGRAD: 1, EmbOptimType.ADAM: 2 * DIM}[optimizer]
    plain = module([options(), options()], optimizer)
    cached = module([options(64, state=state), options(128, state=state)], optimizer)
    want = [step(plain, b) for b in data]
    if prefetch is not None:
        pipe = PrefetchPipeline(
            data, lambda b: step(cached, b), lambda b: cached.prefetch(*b), overlap=prefetch
        )
        got = pipe.run()
    else:
        got = [step(cached, b) for b in data]
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=0, atol=1e-5)
    for t in range(2):
        want_t = contents(plain.tables[t])
        check_tiers(cached.tables[t], want_t)
        assert_same_tables(contents(cached.tables[t]), want_t)
    stats = cached.cache_stats()
    assert all(s.written_back > 0 and s.storage_drops == 0 and s.not_cached == 0 for s in stats)
    if prefetch is not None:  # every key was brought in ahead of its forward
        assert all(s.lookup_hits == s.lookup_keys for s in stats)
    else:
        assert all(0 < s.hit_rate() < 1 for s in stats)


def test_step_scores_match_uncached():
    data = batches(6, seed=3)
    plain = module([options(strategy=DynamicEmbScoreStrategy.STEP)] * 2)
    step_opts = [options(n, strategy=DynamicEmbScoreStrategy.STEP, state=1) for n in (64, 128)]
    cached = module(step_opts)
    for b in data:
        step(plain, b), step(cached, b)
    for t in range(2):
        assert_same_tables(contents(cached.tables[t]), contents(plain.tables[t]))


def test_cache_eviction_preserves_row_state_and_score():
    m = module([options(16, state=1)] * 2)  # one bucket of 16 rows per cache
    table = m.tables[0]
    keys = torch.arange(16, dtype=torch.int64) * 1000 + 1
    filler = (keys[:4], torch.tensor([0] + [4] * 3 * BATCH, dtype=torch.int64))
    for _ in range(3):  # table 0 sees 4 keys in bag 0 of feature 0
        step(m, filler)
    before = {k: v for k, v in contents_of_cache(table).items()}
    assert set(before) == set(keys[:4].tolist())
    # 16 new keys of one batch evict the 4 residents (batch numbers below the floor).
    step(m, (keys + 7, torch.tensor([0] + [16] * 3 * BATCH, dtype=torch.int64)))
    assert not set(contents_of_cache(table)) & set(before)
    rows, scores, found = table.storage.find(keys[:4])
    assert bool(found.all())
    for i, k in enumerate(keys[:4].tolist()):
        torch.testing.assert_close(rows[i], before[k][0], rtol=0, atol=0)
        assert int(scores[i]) == before[k][1] == 3  # LFU: 3 accesses each
    assert table.stats.written_back >= 4


def test_prefetched_keys_survive_until_their_backward():
    plain = module([options()] * 2)
    m = module([options(16, state=1)] * 2)  # one bucket of 16 rows per cache
    table = m.tables[0]
    offs = torch.tensor([0] + [16] * 3 * BATCH, dtype=torch.int64)
    current = (torch.arange(16, dtype=torch.int64) + 100, offs)
    future = (torch.arange(16, dtype=torch.int64) + 200, offs)
    third = (torch.arange(16, dtype=torch.int64) + 300, offs)
    outs = []
    for tables in (m, plain):
        out = tables(*current)  # batch 1 in flight: its 16 rows fill the cache
        tables.prefetch(*future)  # batch 2 cannot evict them: its 16 keys are refused
        if tables is m:
            assert table.stats.not_cached == 16
            assert bool((table.find_slots(current[0]) >= 0).all())
        out.sum().backward()  # batch 1 done
        tables.prefetch(*future)  # now batch 2's keys replace batch 1's
        if tables is m:
            slots = table.find_slots(future[0])
            assert bool((slots >= 0).all())
        # The next forward takes the oldest pending prefetch's number (2) and its keys
        # (batch 3's) cannot evict the ones prefetched for the next batch: they are
        # staged, served and trained outside the cache.
        outs.append(step(tables, third))
        outs.append(step(tables, future))
    assert torch.equal(table.find_slots(future[0]), slots)  # never moved
    assert table.stats.staged == 16
    assert table.stats.lookup_hits == 16  # the future batch: all prefetched
    for got, want in zip(outs[:2], outs[2:]):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
    assert_same_tables(contents(table), contents(plain.tables[0]))


@pytest.mark.parametrize("prefetch", [None, True, False])
def test_cache_smaller_than_a_batch_trains_like_uncached(prefetch):
    data = batches(6, seed=13)
    plain = module([options(), options()], EmbOptimType.EXACT_ADAGRAD)
    cached = module([options(16, state=DIM)] * 2, EmbOptimType.EXACT_ADAGRAD)
    want = [step(plain, b) for b in data]
    if prefetch is not None:
        got = PrefetchPipeline(
            data, lambda b: step(cached, b), lambda b: cached.prefetch(*b), overlap=prefetch
        ).run()
    else:
        got = [step(cached, b) for b in data]
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)
    for t in range(2):
        assert cached.tables[t].stats.staged > 0
        assert cached.tables[t].staged_keys() == 0
        assert_same_tables(contents(cached.tables[t]), contents(plain.tables[t]))
    assert cached.safe_check_failures == [0, 0]


def test_eval_reads_both_tiers_and_inserts_nothing():
    data = batches(4, seed=5)
    plain = module([options(), options()])
    cached = module([options(64, state=1), options(128, state=1)])
    for b in data:
        step(plain, b), step(cached, b)
    plain.eval(), cached.eval()
    probe = batches(1, vocab=800, seed=9)[0]  # hot keys, cold keys and unknown keys
    sizes = [t.cache.size() for t in cached.tables]
    stats = [dataclasses_tuple(s) for s in cached.cache_stats()]
    with torch.no_grad():
        torch.testing.assert_close(cached(*probe), plain(*probe), rtol=1e-5, atol=1e-5)
    assert [t.cache.size() for t in cached.tables] == sizes
    assert [dataclasses_tuple(s) for s in cached.cache_stats()] == stats


def test_erase_removes_keys_from_both_tiers_and_counts_each_once():
    data = batches(6, vocab=2000, seed=6)
    plain = module([options(), options()])
    cached = module([options(32, state=1), options(64, state=1)])
    for b in data:
        step(plain, b), step(cached, b)
    ids = torch.cat([data[0][0], data[5][0]])  # keys in both tiers, repeated
    gone = torch.cat([ids, torch.tensor([123457, 123457])])  # and an unknown one
    for p, c in zip(plain.tables, cached.tables, strict=True):
        assert c.storage.size() > 0 and c.cache_size() > 0
        assert c.erase(gone) == p.erase(gone) > 0
        assert c.size() == p.size()
        assert not bool(c.find(gone)[1].any())


def test_external_storage_trains_like_uncached():
    data = batches(5, seed=11)
    plain = module([options(), options()])
    cached = module([options(n, state=1, external_storage=DictStorage) for n in (64, 128)])
    for b in data:
        torch.testing.assert_close(step(cached, b), step(plain, b), rtol=0, atol=1e-5)
    for t in range(2):
        assert isinstance(cached.tables[t].storage, DictStorage)
        assert_same_tables(contents(cached.tables[t]), contents(plain.tables[t]))


@pytest.mark.parametrize(
    "extra, match",
    [
        (dict(caching=True), "local_hbm_for_values > 0"),
        (dict(caching=True, local_hbm_for_values=-5), "got -5"),
        (dict(external_storage=DictStorage), "needs caching=True"),
        (dict(caching=True, local_hbm_for_values=1 << 16, external_storage=3), "Storage subclass"),
        (
            dict(
                caching=True,
                local_hbm_for_values=1 << 16,
                score_strategy=(DynamicEmbScoreStrategy.TIMESTAMP, DynamicEmbScoreStrategy.LFU),
                external_storage=DictStorage,
            ),
            "cannot keep the last-access time",
        ),  # fmt: skip
    ],
)
def test_bad_options(extra, match):
    with pytest.raises((ValueError, TypeError), match=match):
        module([options(**extra), options()])


@pytest.mark.parametrize("budget, held", [(100, 2), (1, 0)])
def test_budget_under_one_bucket_builds_a_minimal_cache(budget, held):
    # As DynamicEmb rounds such a cache up to one bucket: here one 16-slot bucket.
    data = batches(4, seed=5)
    plain = module([options(), options()])
    small = options(caching=True, local_hbm_for_values=budget)  # 9 float32 columns a row
    match = rf"local_hbm_for_values={budget} bytes hold {held} rows.*one bucket of 16 rows"
    with pytest.warns(UserWarning, match=match):
        cached = module([small, options(64, state=1)])
    assert cached.tables[0].cache.capacity() == MIN_CACHE_ROWS == 16
    for b in data:
        torch.testing.assert_close(step(cached, b), step(plain, b), rtol=0, atol=1e-5)
    for t in range(2):
        assert_same_tables(contents(cached.tables[t]), contents(plain.tables[t]))
    stats = cached.cache_stats()[0]
    assert stats.written_back > 0 and stats.storage_drops == 0


def test_spilled_slow_tier_trains_like_uncached(tmp_path):
    data = batches(4, seed=17)
    plain = module([options(), options()])
    cached = module([options(n, state=1, spill_directory=str(tmp_path)) for n in (64, 128)])
    for b in data:
        torch.testing.assert_close(step(cached, b), step(plain, b), rtol=0, atol=1e-5)
    cached.flush()  # the cache writes back, the slow tier commits its files
    for t in range(2):
        assert_same_tables(contents(cached.tables[t]), contents(plain.tables[t]))
    assert any(tmp_path.iterdir())
