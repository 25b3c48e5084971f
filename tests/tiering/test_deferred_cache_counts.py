"""A cache's counts kept on the device and read later: ``CacheStats.add_later`` adds
them when read; ``ScoredHashTable.write_back_counted`` stores as ``write_back`` and
counts what it drops; and a cached module whose fetched and dropped counts ride on
the next read trains the same tiers, outputs and statistics as the eager path
(counts read at once), with fewer reads a step, on both executors."""

import copy
import dataclasses
import types

import pytest
import torch

from dynemb._host_reads import host_reads, read_to_host
from dynemb.optimizer import EmbOptimType
from dynemb.table.scored_hash_table import ScoredHashTable
from dynemb.tiering import CacheStats
from dynemb.tiering.storage_results import checked_insert
from dynemb.types import DynamicEmbScoreStrategy
from tests.support.caching_models import (
    DIM,
    DictStorage,
    assert_same_tables,
    batches,
    contents,
    contents_of_cache,
    module,
    options,
    step,
)


def test_cache_stats_add_later_adds_when_read():
    stats = CacheStats(fetched=1)
    stats.add_later(fetched=torch.tensor(4), storage_drops=torch.tensor(2, dtype=torch.int32))
    stats.add_later(storage_drops=torch.tensor(3))
    before = host_reads()
    stats.add(fetched=10, written_back=5)  # host counts: no read of the pending ones
    assert host_reads() == before
    assert stats.written_back == 5 and host_reads() == before, "nothing pending for it"
    assert stats.fetched == 15 and host_reads() == before + 1  # the first entry, read now
    assert stats.storage_drops == 5 and host_reads() == before + 2
    stats.add_later(lookup_hits=torch.tensor(7))
    copied, shallow = copy.deepcopy(stats), copy.copy(stats)  # copies read what is pending
    stats.add_later(lookup_hits=torch.tensor(1))  # the original's alone
    assert (
        dataclasses.astuple(copied) == dataclasses.astuple(shallow) == (0, 7, 0, 0, 15, 5, 5, 0, 0)
    )
    assert stats == CacheStats(0, 8, 0, 0, 15, 5, 5, 0, 0)
    stats.add_later(staged=torch.tensor(2))
    before = host_reads()
    read_to_host(torch.zeros(1), "test")  # the next read of the device takes it
    assert stats.staged == 2 and host_reads() == before + 1
    with pytest.raises(ValueError, match="no counter 'fetch'"):
        stats.add_later(fetch=torch.tensor(1))
    with pytest.raises(ValueError, match="no counter 'hits'"):
        stats.add(hits=1)


def _table(init_capacity=None) -> ScoredHashTable:
    return ScoredHashTable(
        dim=4, capacity=256, init_capacity=init_capacity, bucket_capacity=128, extra_columns=1,
        score_strategy=DynamicEmbScoreStrategy.CUSTOMIZED, seed=3,
    )  # fmt: skip


def _export(table: ScoredHashTable) -> tuple:
    keys, rows, scores, _ = table.export_batch(0, table.capacity(), include_extra=True)
    order = keys.argsort()
    return keys[order], rows[order], scores[order]


@pytest.mark.parametrize("init_capacity", [None, 128], ids=["full", "growing"])
def test_write_back_counted_stores_as_write_back_and_counts_its_drops(init_capacity):
    """Four write-backs of 100 keys into 256 slots with random CUSTOMIZED scores: residents
    are evicted and low-scored keys not stored; the count is ``write_back``'s entries."""
    tables = _table(init_capacity), _table(init_capacity)
    gen = torch.Generator().manual_seed(2)
    written, dropped = set(), set()
    for _ in range(4):
        keys = torch.randperm(5000, generator=gen)[:100]
        rows = torch.randn(100, 5, generator=gen)
        scores = torch.randint(0, 50, (100,), generator=gen)
        lost = tables[0].write_back(keys, rows, scores)
        before = host_reads()
        counted = tables[1].write_back_counted(keys, rows, scores)
        if init_capacity is None:  # at capacity: nothing read now
            assert host_reads() == before
        assert counted.dim() == 0 and counted.item() == lost[0].numel()
        written |= set(keys.tolist())
        dropped |= set(lost[0].tolist())
        for got, want in zip(_export(tables[1]), _export(tables[0]), strict=True):
            assert torch.equal(got, want)
    assert tables[1].size() == tables[0].size() == 256
    assert written == set(_export(tables[0])[0].tolist()) | dropped, "each key stored or dropped"
    got, want = tables[1].last_stats, tables[0].last_stats
    assert (got.inserted, got.evicted, got.failed) == (want.inserted, want.evicted, want.failed)
    assert want.evicted > 0 and want.failed > 0, "the case: residents evicted, keys not stored"


def _eager_write_back(self, keys, rows, scores) -> None:
    """The write-back as it was: through the Storage, its drops counted at once."""
    if not keys.numel():
        return
    state = self.state
    with state.storage_lock:
        dropped = checked_insert(state.storage, keys, rows, scores, state.name)
    state.stats.written_back += keys.numel()
    state.stats.storage_drops += dropped.numel()


class _EagerStats(CacheStats):
    """Counts added later are read at once."""

    def add_later(self, **counts):
        self.add(**{n: read_to_host(v, "test").item() for n, v in counts.items()})


def _eager(m):
    for table in m.tables:
        table.state.stats = _EagerStats()
        table.filler.write_back = types.MethodType(_eager_write_back, table.filler)
    return m


def test_deferred_cache_counts_train_as_the_eager_path():
    """Caches of 32 and 64 rows in front of slow tiers of 128 rows, Zipf keys of a
    vocabulary of 3,000: rows are fetched, written back and dropped by the slow
    tier every step; outputs, both tiers and every statistic agree."""

    def make():
        return module([options(32, state=1, max_capacity=128), options(64, max_capacity=128)])

    deferred, eager = make(), _eager(make())
    for batch in batches(12, vocab=3000, seed=4):
        outs, reads = [], []
        for m in (deferred, eager):
            before = host_reads()
            outs.append(step(m, batch))
            reads.append(host_reads() - before)
        assert reads[0] < reads[1], reads
        assert torch.equal(outs[0], outs[1])
    for got, want in zip(deferred.tables, eager.tables, strict=True):
        assert_same_tables(contents_of_cache(got), contents_of_cache(want))
        assert dataclasses.astuple(got.stats) == dataclasses.astuple(want.stats)
        assert got.stats.storage_drops > 0 and got.stats.fetched > 0, "the case: rows dropped"
        assert_same_tables(contents(got), contents(want))  # synced: more write-backs
        assert dataclasses.astuple(got.stats) == dataclasses.astuple(want.stats)
        assert got.storage.size() == want.storage.size() == 128


def test_external_storage_with_a_cache_smaller_than_a_batch_trains_like_uncached():
    """The external slow tier's path of a fill (rows moved by whole-batch copies,
    positions from the claim's counts): evictions, and keys the cache cannot take
    (staged) in every batch, as an uncached table."""
    data = batches(6, seed=13)
    plain = module([options(), options()], EmbOptimType.EXACT_ADAGRAD)
    cached = module(
        [options(16, state=DIM, external_storage=DictStorage)] * 2, EmbOptimType.EXACT_ADAGRAD
    )
    for b in data:
        torch.testing.assert_close(step(cached, b), step(plain, b), rtol=1e-5, atol=1e-5)
    for t in range(2):
        stats = cached.tables[t].stats
        assert stats.staged > 0 and stats.not_cached > 0 and stats.written_back > 0
        assert stats.fetched > 0 and stats.storage_drops == 0
        assert_same_tables(contents(cached.tables[t]), contents(plain.tables[t]))
