"""The tables, batches and checks that the caching tests share, and ``DictStorage``,
a toy external slow tier."""

import numpy as np
import torch

from dynemb import (
    BatchedDynamicEmbeddingTables,
    DynamicEmbInitializerArgs,
    DynamicEmbPoolingMode,
    DynamicEmbScoreStrategy,
    DynamicEmbTableOptions,
)
from dynemb.optimizer import EmbOptimType
from dynemb.tiering import CachedTable, Storage

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


def contents_of_cache(table: CachedTable) -> dict:
    cache = table.cache
    keys, rows, _, _ = cache.export_batch(0, cache.capacity(), include_extra=True)
    slots = cache.find_slots(keys)
    return {k: (r.clone(), int(table.state.user_scores[s])) for k, r, s in zip(keys.tolist(), rows, slots.tolist())}  # fmt: skip


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
