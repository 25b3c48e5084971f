"""Caching mode (dynemb.tiering) against an uncached run of the same training.

The oracle is a BatchedDynamicEmbeddingTables without caching, large enough that
nothing is evicted: with caching on, the same batches must give the same outputs,
and the union of both tiers (the cache winning) the same rows, optimizer state and
scores, with every key exactly once.
"""

import numpy as np
import pytest
import torch

from dynemb import (
    BatchedDynamicEmbeddingTables,
    DynamicEmbInitializerArgs,
    DynamicEmbPoolingMode,
    DynamicEmbScoreStrategy,
    DynamicEmbTableOptions,
)
from dynemb.optimizer import EmbOptimType
from dynemb.tiering import CachedTable, PrefetchPipeline, Storage

DIM, BATCH, POOL = 8, 16, 4
CAPACITY = 4096


def options(cache_rows=0, strategy=DynamicEmbScoreStrategy.LFU, state=0, **extra):
    o = dict(
        dim=DIM,
        max_capacity=CAPACITY,
        score_strategy=strategy,
        initializer_args=DynamicEmbInitializerArgs(lower=-0.5, upper=0.5),
        seed=7,
    )
    if cache_rows:
        o.update(caching=True, local_hbm_for_values=cache_rows * (DIM + state) * 4)
    o.update(extra)
    return DynamicEmbTableOptions(**o)


def module(opts, optimizer=EmbOptimType.EXACT_ROWWISE_ADAGRAD, pooling=DynamicEmbPoolingMode.SUM):
    return BatchedDynamicEmbeddingTables(
        opts, feature_table_map=[0, 1, 1], pooling_mode=pooling, optimizer=optimizer,
        learning_rate=0.1,
    )  # fmt: skip


def batches(n, vocab=400, seed=0):
    """n batches of 3 features x BATCH bags x POOL ids, Zipf-like (hot and cold keys)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        ids = np.minimum(rng.zipf(1.3, 3 * BATCH * POOL), vocab) * 7919 - 3 * vocab
        offsets = torch.arange(0, 3 * BATCH + 1, dtype=torch.int64) * POOL
        out.append((torch.from_numpy(ids.astype(np.int64)), offsets))
    return out


def step(m, batch):
    out = m(*batch)
    (out * torch.linspace(-1, 1, out.shape[1])).sum().backward()
    return out.detach()


def contents(table):
    """{key: (row with state, score)} of a table (a CachedTable is synced first)."""
    if isinstance(table, CachedTable):
        table.sync()
        storage, end = table.storage, table.storage.end_offset()
        export = storage.export_batch
    else:
        end = table.capacity()

        def export(offset, n):
            return table.export_batch(offset, n, include_extra=True)

    found, offset = {}, 0
    while offset < end:
        keys, rows, scores, offset = export(offset, 1024)
        for k, r, s in zip(keys.tolist(), rows, scores.tolist()):
            assert k not in found, f"key {k} exported twice"
            found[k] = (r.clone(), s)
    return found


def check_tiers(cached: CachedTable, want: dict) -> None:
    """Union of the tiers (cache winning), read without a sync, equals ``want``."""
    cache = cached.cache
    ckeys, crows, _, _ = cache.export_batch(0, cache.capacity(), include_extra=True)
    assert len(set(ckeys.tolist())) == ckeys.numel(), "a key sits twice in the cache"
    union = dict(zip(ckeys.tolist(), crows))
    offset, end = 0, cached.storage.end_offset()
    while offset < end:
        keys, rows, _, offset = cached.storage.export_batch(offset, 1024)
        for k, r in zip(keys.tolist(), rows):
            union.setdefault(k, r)
    assert set(union) == set(want), "keys lost or invented between the tiers"
    for k, (row, _) in want.items():
        torch.testing.assert_close(union[k], row, rtol=0, atol=1e-6, msg=f"row of key {k}")


def assert_same_tables(got: dict, want: dict, scores=True) -> None:
    assert set(got) == set(want)
    for k in want:
        torch.testing.assert_close(got[k][0], want[k][0], rtol=0, atol=1e-6)
        if scores:
            assert got[k][1] == want[k][1], f"score of key {k}"


# prefetch: None (none), or PrefetchPipeline's overlap (background thread, or inline).
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


def contents_of_cache(table: CachedTable) -> dict:
    cache = table.cache
    keys, rows, _, _ = cache.export_batch(0, cache.capacity(), include_extra=True)
    slots = cache.find_slots(keys)
    return {k: (r.clone(), int(table._user_scores[s])) for k, r, s in zip(keys.tolist(), rows, slots.tolist())}  # fmt: skip


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


def dataclasses_tuple(s):
    import dataclasses

    return dataclasses.astuple(s)


class DictStorage(Storage):
    """A toy external slow tier: a Python dict."""

    def __init__(self, spec):
        self.spec, self.rows = spec, {}

    def find(self, keys):
        n = keys.numel()
        rows = torch.zeros((n, self.spec.row_width), dtype=self.spec.value_dtype)
        scores = torch.zeros(n, dtype=torch.int64)
        found = torch.zeros(n, dtype=torch.bool)
        for i, k in enumerate(keys.tolist()):
            if k in self.rows:
                rows[i], scores[i] = self.rows[k]
                found[i] = True
        return rows, scores, found

    def insert(self, keys, rows, scores):
        for k, r, s in zip(keys.tolist(), rows, scores.tolist()):
            self.rows[k] = (r.clone(), s)
        empty = keys[:0]
        return empty, rows[:0], empty

    def erase(self, keys):
        return sum(self.rows.pop(k, None) is not None for k in keys.tolist())

    def export_batch(self, offset, n):
        items = sorted(self.rows.items())[offset : offset + n]
        keys = torch.tensor([k for k, _ in items], dtype=torch.int64)
        rows = (
            torch.stack([r for _, (r, _) in items])
            if items
            else torch.zeros((0, self.spec.row_width))
        )
        scores = torch.tensor([s for _, (_, s) in items], dtype=torch.int64)
        return keys, rows, scores, min(offset + n, len(self.rows))

    def end_offset(self):
        return len(self.rows)

    def size(self):
        return len(self.rows)


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
        (
            dict(caching=True, local_hbm_for_values=100),
            "local_hbm_for_values=100 bytes hold 2 rows",
        ),
        (dict(caching=True, local_hbm_for_values=-5), "got -5"),
        (dict(external_storage=DictStorage), "needs caching=True"),
        (dict(caching=True, local_hbm_for_values=1 << 16, external_storage=3), "Storage subclass"),
        (
            dict(
                caching=True,
                local_hbm_for_values=1 << 16,
                score_strategy=(DynamicEmbScoreStrategy.TIMESTAMP, DynamicEmbScoreStrategy.LFU),
            ),
            "does not support score_strategy",
        ),  # fmt: skip
    ],
)
def test_bad_options(extra, match):
    with pytest.raises((ValueError, TypeError), match=match):
        module([options(**extra), options()])


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


def test_pipeline_overlap_defaults_to_a_spare_core(monkeypatch):
    from dynemb.tiering import pipeline

    monkeypatch.setattr(pipeline.os, "sched_getaffinity", lambda pid: set(range(4)))
    monkeypatch.setattr(pipeline.torch, "get_num_threads", lambda: 4)
    assert PrefetchPipeline([], print, print).overlap is False
    monkeypatch.setattr(pipeline.torch, "get_num_threads", lambda: 3)
    assert PrefetchPipeline([], print, print).overlap is True
    assert PrefetchPipeline([], print, print, overlap=False).overlap is False


@pytest.mark.parametrize("overlap", [True, False])
def test_pipeline_prefetches_each_batch_before_its_step(overlap):
    events = []
    pipe = PrefetchPipeline(
        range(4), lambda b: events.append(("step", b)) or b,
        lambda b: events.append(("prefetch", b)), overlap=overlap,
    )  # fmt: skip
    assert pipe.run() == [0, 1, 2, 3]
    steps = [e for e in events if e[0] == "step"]
    assert steps == [("step", b) for b in range(4)]
    for b in range(4):  # prefetched once, before its own step
        assert events.count(("prefetch", b)) == 1
        assert events.index(("prefetch", b)) < events.index(("step", b))


def test_thread_limit_is_per_thread():
    import threading

    from dynemb import _ops

    main = torch.get_num_threads()
    seen = {}

    def worker():
        _ops.set_thread_limit(1)
        seen["worker"] = torch.get_num_threads()
        x = torch.randn(1 << 16)
        seen["sum"] = float(x.sum())  # an ATen parallel op runs under the limit

    t = threading.Thread(target=worker)
    t.start()
    t.join()
    assert seen["worker"] == 1
    assert torch.get_num_threads() == main
    with pytest.raises(ValueError, match="n must be >= 1"):
        _ops.set_thread_limit(0)


@pytest.mark.parametrize("overlap", [True, False])
def test_forward_reuses_its_prefetch(overlap, monkeypatch):
    """A batch prefetched whole is not looked up again: its forward reuses the
    prefetch's distinct keys and slots (one cache fill per batch), same results."""
    data = batches(6, seed=5)
    plain = module([options(), options()])
    cached = module([options(128, state=1), options(128, state=1)])
    fills = []
    original = CachedTable._fill
    monkeypatch.setattr(
        CachedTable,
        "_fill",
        lambda self, *a, **k: fills.append(k["stage"]) or original(self, *a, **k),
    )
    want = [step(plain, b) for b in data]
    got = PrefetchPipeline(
        data, lambda b: step(cached, b), lambda b: cached.prefetch(*b), overlap=overlap
    ).run()
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=0, atol=1e-5)
    assert fills == [False] * (2 * len(data))  # prefetches only, two tables
    changed = batches(1, seed=6)[0]
    cached.prefetch(*data[0])  # then a forward of other keys: looked up as usual
    step(cached, changed)
    assert fills[-2:] == [True, True]
