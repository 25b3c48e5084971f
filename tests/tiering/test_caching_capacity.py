"""What ``max_capacity`` bounds in caching mode (CachedTable.max_capacity): the slow
tier's keys, which after every sync are the whole table. Between syncs the cache may
hold up to its own capacity more; a sync drops from the cache the keys the evicting
slow tier did not keep, so ``size()`` and the keys findable never exceed the slots of
an uncached table of the same ``max_capacity``."""

import pytest
import torch

from dynemb import DynamicEmbScoreStrategy as S
from tests.support.caching_models import BATCH, POOL, module, options

STRATEGIES = {
    "decayed_lfu": {"score_strategy": S.DECAYED_LFU, "score_half_life_steps": 2},
    "lfu": {"score_strategy": S.LFU},
    "timestamp_lfu": {"score_strategy": (S.TIMESTAMP, S.LFU)},
}
MAX_CAPACITY = 32


def _batch(g: torch.Generator):
    ids = torch.randint(0, 200, (3 * BATCH * POOL,), generator=g) * 7919 + 5
    return ids, torch.arange(0, 3 * BATCH + 1) * POOL


def _findable(table, keys: torch.Tensor) -> int:
    return int(table.find(keys)[1].sum())


# A cache of 16 rows fits in one slow bucket: a sync's write-back stores every cached
# key (evicting the slow tier's lowest). A cache of 64 rows does not: keys of a sync
# that find their slow bucket full of keys of the same sync are not kept, and leave.
@pytest.mark.parametrize("cache_rows", [16, 64])
@pytest.mark.parametrize("strategy", list(STRATEGIES))
def test_an_evicting_slow_tier_bounds_the_table_after_every_sync(strategy, cache_rows):
    opts = options(cache_rows, strategy=None, state=1, max_capacity=MAX_CAPACITY,
                   bucket_capacity=16, **STRATEGIES[strategy])  # fmt: skip
    m = module([opts] * 2)
    plain = module([options(strategy=None, max_capacity=MAX_CAPACITY, bucket_capacity=16,
                            **STRATEGIES[strategy])] * 2)  # fmt: skip
    every = torch.arange(0, 200) * 7919 + 5
    g = torch.Generator().manual_seed(3)
    for i in range(12):
        ids, offsets = _batch(g)
        m(ids, offsets).sum().backward()
        plain(ids, offsets).sum().backward()
        for table, twin in zip(m.tables, plain.tables):
            bound = twin.capacity()  # the slots of the uncached table
            assert table.storage.table.capacity() == bound
            # between syncs: the slow tier's keys plus at most the cache's
            assert _findable(table, every) <= bound + table.capacity()
            if i % 3 == 2:
                assert table.size() <= bound  # size() syncs
                assert _findable(table, every) == table.size() <= bound
    stats = m.cache_stats()
    assert all(s.storage_drops > 0 for s in stats)  # the slow tier evicted all along


def test_a_sync_keeps_the_keys_of_batches_in_flight():
    """A key whose batch has not run its backward stays cached through a sync, even
    when the slow tier did not keep it: its backward writes its slot."""
    opts = options(64, state=1, max_capacity=MAX_CAPACITY, bucket_capacity=16)
    m = module([opts] * 2)
    g = torch.Generator().manual_seed(5)
    for _ in range(4):
        ids, offsets = _batch(g)
        m(ids, offsets).sum().backward()
    ids, offsets = _batch(g)
    out = m(ids, offsets)  # in flight until its backward
    table = m.tables[0]
    keys = torch.unique(ids[: BATCH * POOL])
    cached = table.find_slots(keys) >= 0
    table.sync()
    assert bool((table.find_slots(keys[cached]) >= 0).all())
    assert not bool(table.storage.table.contains(keys[cached]).all())  # some not kept
    out.sum().backward()
    assert table.size() <= table.storage.table.capacity()
    assert _findable(table, torch.arange(0, 200) * 7919 + 5) == table.size()
