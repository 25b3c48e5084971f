"""Concurrency: several Python threads on one table, and all OpenMP threads on one batch.

New rows come from a UNIFORM initializer, a function of (seed, key) only: a second,
single-threaded table gives every key's own row, so any lost key or misplaced row is
visible exactly.
"""

import queue
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
        except BaseException as e:  # re-raised in the main thread
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


@pytest.mark.no_emulated_pass(
    "the CPU executor's OpenMP threads are under test; the emulated kernels' threads on "
    "one batch are the parity suite's and TSan's"
)
@pytest.mark.parametrize("strategy", [S.NO_EVICTION, S.TIMESTAMP])  # two buckets, or one
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


@pytest.mark.parametrize("strategy", [S.NO_EVICTION, S.TIMESTAMP])  # two buckets, or one
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
        erased[threads] = _ops.table_erase(t.buffers.tensors(), batch)
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


def _live_keys(t) -> torch.Tensor:
    """Every key the table's slots hold (a full scan), sorted."""
    keys, _, _, end = t.export_batch(0, t.capacity())
    assert end == t.capacity()
    return keys.sort().values


@pytest.mark.parametrize("strategy", [S.NO_EVICTION, S.LFU])
def test_python_threads_erase_while_others_insert_and_read(strategy):
    """Erasers remove keys whose insert an inserter confirmed (a queue hands them over,
    one eraser per batch), and re-insert some of them; inserters keep inserting fresh
    keys, growing the table under the erasers; a reader checks keys nobody erases.
    Key ranges are disjoint, so the end state is known: exactly the keys inserted and
    not erased since (re-inserted ones included) are stored, each with its own row."""
    t = _table(strategy, capacity=2**19, init_capacity=1024)  # grows during the run
    stable = torch.arange(1, 2001, dtype=torch.int64)
    t.find_or_insert(stable)
    stable_rows = _own_rows(stable)
    inserters, erasers, batches_each = 2, 2, 24
    batches = {
        w: (torch.randperm(2**22, generator=torch.Generator().manual_seed(w))[: 1500 * batches_each]
            + (w + 1) * 2**24).view(batches_each, 1500)
        for w in range(inserters)
    }  # fmt: skip  # distinct keys, one range per inserter, none below 2**24
    own = {w: [_own_rows(keys) for keys in batches[w]] for w in batches}
    handed = queue.Queue()
    erased, reinserted, wrong = [], [], []
    done_lock, done = threading.Lock(), [0]

    def inserter(w):
        try:
            for i, (keys, want) in enumerate(zip(batches[w], own[w])):
                if not torch.equal(t.find_or_insert(keys), want):
                    wrong.append(("inserted row", w))
                handed.put((w, i))  # its insert is complete: an eraser may take it
        finally:
            with done_lock:
                done[0] += 1
                if done[0] == inserters:
                    handed.put(None)  # after every batch: erasers drain the queue first

    def eraser(e):
        absent = -torch.arange(1, 501, dtype=torch.int64) - 1000 * e  # never inserted
        while (item := handed.get(timeout=60)) is not None:
            w, i = item
            gone = batches[w][i][i % 3 :: 3]  # a third of the batch
            if not bool(t.erase_keys(gone).all()):
                wrong.append(("erase missed a stored key", e))
            if t.erase(absent) != 0:
                wrong.append(("erase found an absent key", e))
            if bool(t.contains(gone).any()):
                wrong.append(("erased key still found", e))
            erased.append(gone)
            if i % 4 == 0:  # some come back, with their initial rows
                back = gone[::5]
                if not torch.equal(t.find_or_insert(back), own[w][i][i % 3 :: 3][::5]):
                    wrong.append(("re-inserted row", e))
                reinserted.append(back)
        handed.put(None)  # for the other erasers

    def reader():
        for _ in range(40):
            values, found = t.find(stable)
            if not bool(found.all()) or not torch.equal(values, stable_rows):
                wrong.append(("stable row", "reader"))

    _run_threads(
        [lambda w=w: inserter(w) for w in range(inserters)]
        + [lambda e=e: eraser(e) for e in range(erasers)]
        + [reader]
    )
    assert wrong == []
    assert t.capacity() > 1024  # growth ran alongside the erasers
    # The oracle: inserted keys, minus erased ones, plus the re-inserted ones.
    inserted = torch.cat([stable] + [b.reshape(-1) for b in batches.values()])
    present = set(inserted.tolist())
    present -= set(torch.cat(erased).tolist())
    present |= set(torch.cat(reinserted).tolist())
    assert len(erased) == inserters * batches_each  # every batch went through an eraser
    values, found = t.find(inserted)
    want_found = torch.tensor([k in present for k in inserted.tolist()])
    assert torch.equal(found, want_found), f"{int((found != want_found).sum())} keys wrong"
    assert torch.equal(values[found], _own_rows(inserted[found]))
    assert bool((values[~found] == 0).all())
    assert t.size() == len(present)
    assert torch.equal(_live_keys(t), torch.tensor(sorted(present)))  # no ghost, no duplicate
