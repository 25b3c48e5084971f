"""Concurrency: several Python threads on one table, and all OpenMP threads on one batch.

New rows come from a UNIFORM initializer, a function of (seed, key) only: a second,
single-threaded table gives every key's own row, so any lost key or misplaced row is
visible exactly.
"""

import threading

import pytest
import torch

import dynemb
from dynemb import DynamicEmbInitializerArgs, DynamicEmbInitializerMode, _ops
from dynemb import DynamicEmbScoreStrategy as S

INIT = DynamicEmbInitializerArgs(mode=DynamicEmbInitializerMode.UNIFORM, lower=-1.0, upper=1.0)


def _table(strategy=S.NO_EVICTION, capacity=2**18, init_capacity=1024):
    return dynemb.ScoredHashTable(
        dim=4,
        capacity=capacity,
        init_capacity=init_capacity,
        score_strategy=strategy,
        initializer=INIT,
    )


def _own_rows(keys: torch.Tensor) -> torch.Tensor:
    """Each key's initial row, from a fresh table filled on one thread."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        ref = _table(S.NO_EVICTION, capacity=2 * keys.numel() + 1024, init_capacity=None)
        return ref.find_or_insert(keys)
    finally:
        torch.set_num_threads(before)


def _run_threads(targets):
    errors = []

    def wrap(fn):
        try:
            fn()
        except BaseException as e:  # noqa: BLE001 - re-raised in the main thread
            errors.append(e)

    threads = [threading.Thread(target=wrap, args=(fn,)) for fn in targets]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=120)
        assert not th.is_alive(), "a thread hung"
    if errors:
        raise errors[0]


@pytest.mark.parametrize("strategy", [S.NO_EVICTION, S.LFU])
def test_python_threads_insert_and_read_concurrently(strategy):
    t = _table(strategy, capacity=2**19)
    preloaded = torch.arange(1, 5001, dtype=torch.int64)
    t.find_or_insert(preloaded)
    preloaded_rows = _own_rows(preloaded)
    wrong_reads, written = [], []
    batches = {
        w: [torch.randint(10_000, 2**24, (3000,), generator=g) for _ in range(30)]
        for w, g in ((w, torch.Generator().manual_seed(w)) for w in range(3))
    }
    own = {w: [_own_rows(keys) for keys in batches[w]] for w in batches}

    def writer(w):
        for keys, want in zip(batches[w], own[w]):
            written.append(keys)
            rows = t.find_or_insert(keys)
            if not torch.equal(rows, want):
                wrong_reads.append(("writer", w))

    def reader(r):
        for _ in range(60):
            values, found = t.find(preloaded)
            if not bool(found.all()) or not torch.equal(values, preloaded_rows):
                wrong_reads.append(("reader", r))

    _run_threads(
        [lambda w=w: writer(w) for w in range(3)] + [lambda r=r: reader(r) for r in range(2)]
    )
    assert wrong_reads == []
    # Every key any writer inserted is there, with its own row.
    everything = torch.cat([preloaded] + written)
    values, found = t.find(everything)
    assert bool(found.all()), f"{int((~found).sum())} keys lost"
    assert torch.equal(values, _own_rows(everything))
    assert t.size() == everything.unique().numel()


@pytest.mark.parametrize("strategy", [S.NO_EVICTION, S.TIMESTAMP])  # bucket locks, or none
def test_all_openmp_threads_on_one_batch(strategy):
    torch.set_num_threads(2)
    t = _table(strategy, capacity=2**20, init_capacity=2**20)
    keys = torch.randperm(2**22)[: 2**19] + 1  # distinct, < 2**24
    dup = torch.cat([keys, keys[:1000]])  # duplicates across the batch
    rows = t.find_or_insert(dup)
    stats = t.last_stats
    assert stats.inserted == keys.numel() and stats.hits == 1000 and stats.failed == 0
    assert torch.equal(rows, _own_rows(dup))
    values, found = t.find(keys)
    assert bool(found.all()) and torch.equal(values, _own_rows(keys))
    assert t.erase(keys[::2]) == keys[::2].numel()
    assert t.size() == keys.numel() - keys[::2].numel()
    assert not bool(t.contains(keys[::2]).any()) and bool(t.contains(keys[1::2]).all())


@pytest.mark.parametrize("strategy", [S.NO_EVICTION, S.TIMESTAMP])  # bucket locks, or none
def test_erase_on_all_threads_reports_each_key_like_one_thread(strategy):
    """A multi-thread erase (each thread walks the batch block by block) reports, per
    key, what the one-thread erase does: the first occurrence of each stored key,
    duplicates blocks apart included, and nothing for absent keys."""
    gen = torch.Generator().manual_seed(3)
    stored = torch.randperm(2**22, generator=gen)[: 2**15] + 1
    absent = -torch.arange(1, 2001)
    batch = torch.cat([stored[::2], absent, stored[:3000]])  # repeats 3000 keys, 20k apart
    batch = batch[torch.randperm(batch.numel(), generator=gen)[: batch.numel()]]
    batch = torch.cat([batch, batch[:5000]])  # and again, a whole batch later
    erased, remaining = {}, {}
    for threads in (1, 2):
        torch.set_num_threads(threads)
        t = _table(strategy, capacity=2**16, init_capacity=2**16)
        t.find_or_insert(stored)
        erased[threads] = _ops.table_erase(t._storage.tensors(), batch)
        remaining[threads] = t.contains(stored)
    first = torch.zeros(batch.numel(), dtype=torch.bool)
    seen = set()
    stored_set = set(stored.tolist())
    for i, k in enumerate(batch.tolist()):
        first[i] = k in stored_set and k not in seen
        seen.add(k)
    assert torch.equal(erased[1], first)
    assert torch.equal(erased[2], first)
    assert torch.equal(remaining[2], remaining[1])
    assert int((~remaining[2]).sum()) == int(first.sum())
