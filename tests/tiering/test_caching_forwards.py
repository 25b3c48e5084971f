"""Caching mode with several forwards before one backward, against the table in memory.

Multi-tower and multi-task models look one table up several times per step and
run one backward. Every forward's batch stays in flight (its cache rows pinned,
the keys the cache cannot take staged) until its backward, or until its graph is
dropped: so a cached table trains exactly like the same table without caching,
whatever the number of forwards and the cache size. The oracle is the same module
without caching (nothing evicted); the loss is linear in the outputs, so every
gradient is the same in both and the rows, optimizer state and scores must be
equal bit for bit.
"""

import gc

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dynemb import (
    DynamicEmbScoreStrategy,
)
from dynemb.optimizer import EmbOptimType
from dynemb.tiering import CachedTable, PrefetchPipeline
from dynemb.tiering.cache_fill import CacheFill
from tests.support.caching_towers import BAGS, POOL, batch, loss, module

OPT = EmbOptimType


def contents(table):
    """{key: (row with optimizer state, score)}; a CachedTable is synced first."""
    if isinstance(table, CachedTable):
        table = table.persistent_table()
    keys, rows, scores, _ = table.export_batch(0, table.capacity(), include_extra=True)
    return {k: (r, s) for k, r, s in zip(keys.tolist(), rows, scores.tolist(), strict=True)}


def assert_same(cached, plain):
    got, want = contents(cached.tables[0]), contents(plain.tables[0])
    assert set(got) == set(want), "keys lost or invented"
    for k, (row, score) in want.items():
        assert torch.equal(got[k][0], row), f"key {k}: row {got[k][0]} != {row}"
        assert got[k][1] == score, f"key {k}: score {got[k][1]} != {score}"


def train_step(m, batches, prefetch=None):
    """Forwards of every batch (towers), then one backward of their summed loss.
    ``prefetch``: None, "each" (each batch right before its forward) or "step"
    (every batch, then the forwards)."""
    if prefetch == "step":
        for b in batches:
            m.prefetch(*b)
    outs = []
    for b in batches:
        if prefetch == "each":
            m.prefetch(*b)
        outs.append(m(*b))
    loss(outs).backward()
    return [o.detach() for o in outs]


@pytest.mark.parametrize("optimizer", [OPT.EXACT_SGD, OPT.EXACT_ROWWISE_ADAGRAD, OPT.ADAM])
def test_three_towers_train_like_in_memory(optimizer):
    """The reproducer: three towers of 24 distinct keys over a 16-row cache, one
    backward. Every tower's rows and optimizer state move as in memory, the first
    tower's included."""
    plain, cached = module(optimizer), module(optimizer, cache_rows=16)
    towers = [batch(np.arange(24) + 100 * t) for t in range(3)]
    for _ in range(2):
        want = train_step(plain, towers)
        got = train_step(cached, towers)
        for g, w in zip(got, want, strict=True):
            torch.testing.assert_close(g, w, rtol=0, atol=1e-6)
        assert_same(cached, plain)
    table = cached.tables[0]
    assert table.stats.staged > 0 and table.stats.storage_drops == 0
    assert table.staged_keys() == 0 and table.batches_in_flight() == 0


def test_a_key_staged_by_one_tower_trains_on_one_row_with_every_gradient():
    """Towers sharing keys that the cache cannot take: the later towers join the
    staged rows (no error), each staged row gets every tower's gradient, and eval
    reads and checkpoints between two backwards see the staged rows as in memory."""
    plain, cached = module(OPT.EXACT_ROWWISE_ADAGRAD), module(OPT.EXACT_ROWWISE_ADAGRAD, 16)
    first = batch(np.arange(24))  # 16 cached, 8 staged
    shared = batch(np.concatenate([np.arange(8, 24), np.arange(200, 208)]))
    both = (plain, cached)
    firsts = [m(*first) for m in both]
    seconds = [m(*shared) for m in both]
    for out in seconds:
        loss([out]).backward()  # the second forward's backward first
    for m in both:
        m.eval()
    with torch.no_grad():  # reads the staged rows that backward moved
        torch.testing.assert_close(cached(*first), plain(*first), rtol=0, atol=1e-6)
    for m in both:
        m.train()
    assert_same(cached, plain)  # a checkpoint's sync writes the staged rows too
    for out in firsts:
        loss([out]).backward()
    table = cached.tables[0]
    assert table.stats.staged > table.stats.not_cached  # later towers joined staged keys
    assert table.staged_keys() == 0
    assert_same(cached, plain)


def test_a_dropped_forward_pins_nothing():
    """Forwards whose graph is dropped (or that run under no_grad) end at the table's
    next call: a later step evicts their rows, and their staged new keys go home
    with their initial rows, as in memory."""
    plain, cached = module(OPT.EXACT_SGD), module(OPT.EXACT_SGD, cache_rows=16)
    table = cached.tables[0]
    for m in (plain, cached):  # each forward: 16 keys cached (pinned), 8 staged
        m(*batch(np.arange(24)))  # its output dropped at once
        out = m(*batch(np.arange(24) + 100))
        del out
        with torch.no_grad():
            m(*batch(np.arange(24) + 200))
        gc.collect()
    assert table.batches_in_flight() == 0 and table.staged_keys() == 0
    fresh = batch(np.arange(24) + 300)
    train_step(plain, [fresh])
    before = table.stats.not_cached
    train_step(cached, [fresh])
    assert table.stats.not_cached == before + 8  # 16 keys evicted the dropped ones
    assert bool((table.find_slots(fresh[0][:16]) >= 0).all())
    assert_same(cached, plain)


def test_erasing_a_staged_key_in_flight_keeps_it_erased():
    """An erase between a forward and its backward removes a cached and a staged key
    for good: the backward's update of the staged row is not written back."""
    plain, cached = module(OPT.EXACT_SGD), module(OPT.EXACT_SGD, cache_rows=16)
    keys, gone = batch(np.arange(24)), torch.tensor([3, 20])
    outs = [m(*keys) for m in (plain, cached)]
    table = cached.tables[0]
    assert table.staged_keys() == 8
    assert (table.find_slots(gone) >= 0).tolist() == [True, False]  # 3 cached, 20 staged
    for m, out in zip((plain, cached), outs, strict=True):
        assert m.tables[0].erase(gone) == 2
        loss([out]).backward()
        assert not bool(m.tables[0].find(gone)[1].any())
    assert table.staged_keys() == 0
    assert_same(cached, plain)


@settings(max_examples=30, deadline=None)
@given(
    optimizer=st.sampled_from([OPT.EXACT_SGD, OPT.EXACT_ADAGRAD, OPT.ADAM]),
    strategy=st.sampled_from([DynamicEmbScoreStrategy.LFU, DynamicEmbScoreStrategy.STEP]),
    cache_rows=st.integers(16, 64),
    forwards=st.lists(st.integers(1, 4), min_size=1, max_size=4),
    vocab=st.sampled_from([40, 120, 400]),
    prefetch=st.sampled_from([None, "each", "step"]),
    drop=st.booleans(),
    seed=st.integers(0, 10**6),
)
def test_any_forwards_per_backward_train_like_in_memory(
    optimizer, strategy, cache_rows, forwards, vocab, prefetch, drop, seed
):
    """Steps of 1-4 forwards of random (repeating, overlapping) keys, then one
    backward each; without prefetch, or with a prefetch of each forward's batch;
    with ``drop``, each step also runs a forward whose output is dropped unused."""
    rng = np.random.default_rng(seed)
    plain, cached = module(optimizer, 0, strategy), module(optimizer, cache_rows, strategy)
    for n in forwards:
        towers = [batch(rng.integers(0, vocab, 2 * BAGS * POOL) * 7 - vocab) for _ in range(n)]
        if drop:
            plain(*towers[-1]), cached(*towers[-1])
        want = train_step(plain, towers)
        got = train_step(cached, towers, prefetch=prefetch)
        for g, w in zip(got, want, strict=True):
            torch.testing.assert_close(g, w, rtol=0, atol=1e-5)
    table = cached.tables[0]
    assert table.staged_keys() == 0 and table.batches_in_flight() == 0
    assert table.stats.storage_drops == 0
    assert_same(cached, plain)


@pytest.mark.parametrize("cache_rows", [16, 512])
@pytest.mark.parametrize("overlap", [True, False])
def test_prefetch_pipeline_of_four_towers(cache_rows, overlap, monkeypatch):
    """PrefetchPipeline over steps of four towers (each step's four batches
    prefetched, in the background during the previous step with ``overlap``): the
    same training as in memory; with a cache that holds them, every forward reuses
    its prefetch (no lookup of its own)."""
    lookups = []
    fill = CacheFill.fill
    monkeypatch.setattr(
        CacheFill,
        "fill",
        lambda self, *a, **k: lookups.append(k["stage"]) or fill(self, *a, **k),
    )
    rng = np.random.default_rng(3)
    steps = [[batch(rng.integers(0, 300, 2 * BAGS * POOL) * 7) for _ in range(4)] for _ in range(5)]
    plain, cached = module(OPT.ADAM), module(OPT.ADAM, cache_rows)
    want = [train_step(plain, towers) for towers in steps]

    def prefetch(towers):
        for b in towers:
            cached.prefetch(*b)

    got = PrefetchPipeline(
        steps, lambda towers: train_step(cached, towers), prefetch, overlap=overlap
    ).run()
    for g, w in zip(got, want, strict=True):
        for a, b in zip(g, w, strict=True):
            torch.testing.assert_close(a, b, rtol=0, atol=1e-5)
    assert_same(cached, plain)
    stats = cached.tables[0].stats
    if cache_rows == 512:
        assert stats.lookup_hits == stats.lookup_keys and not any(lookups)
    else:
        assert stats.staged > 0
