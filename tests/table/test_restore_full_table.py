"""A NO_EVICTION table saved at its max capacity restores every key.

Two choices placed by the fills as each batch starts leave a full table whose keys sit
in the buckets their history gave them; a restore (no slots saved) that places keys
the same way lost ~0.8% of them. Its pass 2 now makes room for a key whose two buckets
are full by moving a resident, with its row, to its other bucket (one move, or a chain
of two or three: csrc/core/tile_room.h), on every executor. A moved key must keep its own row, on a
hybrid table's slow tier too."""

import tempfile
from pathlib import Path

import pytest
import torch

import dynemb
from dynemb import (
    BatchedDynamicEmbeddingTables,
    DynamicEmbDump,
    DynamicEmbLoad,
    DynamicEmbPoolingMode,
    DynamicEmbTableOptions,
)
from dynemb import DynamicEmbScoreStrategy as S
from dynemb.optimizer import EmbOptimType
from tests.support import reference as ref

CAPACITY, BUCKET, DIM = 1 << 13, 128, 4


def _table(device, fast_rows=None, capacity=CAPACITY, bucket=BUCKET):
    return dynemb.ScoredHashTable(
        dim=DIM, capacity=capacity, init_capacity=capacity, bucket_capacity=bucket,
        score_strategy=S.NO_EVICTION, extra_columns=2, device=device, fast_rows=fast_rows,
    )  # fmt: skip


def _filled(device, fast_rows=None, seed=0, capacity=CAPACITY, bucket=BUCKET):
    """A table filled by batches of random keys up to its first failed insert."""
    table = _table(device, fast_rows, capacity, bucket)
    g = torch.Generator().manual_seed(seed)
    n = max(capacity // 64, 4)  # a batch of keys, at least 4 in a table of few slots
    while True:
        keys = torch.randint(-(1 << 62), 1 << 62, (n,), generator=g).to(device)
        table.insert_or_assign(keys, torch.randn(keys.numel(), DIM + 2, generator=g).to(device))
        if table.last_stats.failed:
            return table


def _saved(table):
    """The table's entries in slot order (a dump's order), with their whole rows."""
    keys, rows, _, _ = table.export_batch(0, table.capacity(), include_extra=True)
    return keys, rows


@pytest.mark.parametrize("fast_rows", [None, 3000], ids=["memory", "hybrid"])
@pytest.mark.parametrize("chunk", [None, 1000], ids=["one-call", "chunks"])
def test_a_table_saved_at_max_capacity_restores_every_key_with_its_row(device, fast_rows, chunk):
    saved = _filled(device, fast_rows)
    keys, rows = _saved(saved)
    assert keys.numel() > 0.95 * CAPACITY  # full: the load of a first failed insert
    restored = _table(device, fast_rows)
    step = keys.numel() if chunk is None else chunk
    for s in range(0, keys.numel(), step):
        stats = restored.restore(keys[s : s + step], rows[s : s + step, :DIM],
                                 rows[s : s + step, DIM:])  # fmt: skip
        assert stats.failed == 0
    assert restored.size() == keys.numel()
    found = restored.export_batch(0, restored.capacity(), include_extra=True)
    order_saved, order_found = torch.argsort(keys), torch.argsort(found[0])
    assert torch.equal(found[0][order_found], keys[order_saved])
    # Each key reads its own row, wherever a move took it (the invariant, not a copy).
    assert torch.equal(found[1][order_found], rows[order_saved])
    values, found_mask = restored.find(keys)
    assert bool(found_mask.all()) and torch.equal(values, rows[:, :DIM])


def test_keys_restored_in_any_order_fail_only_when_both_buckets_are_full(device):
    keys, rows = _saved(_filled(device, seed=1))
    perm = torch.randperm(keys.numel(), generator=torch.Generator().manual_seed(3))
    keys, rows = keys[perm.to(device)], rows[perm.to(device)]
    restored = _table(device)
    stats = restored.restore(keys, rows[:, :DIM], rows[:, DIM:])
    assert stats.failed <= keys.numel() // 1000
    lost = keys[~restored.contains(keys)]
    assert lost.numel() == stats.failed == keys.numel() - restored.size()
    assert all(ref.window_full(restored, int(k)) for k in lost.cpu().tolist())


@pytest.mark.parametrize(
    "seed, fast_rows", [(2, None), (9, None), (9, 6000)], ids=["2", "9", "9-hybrid"]
)
def test_keys_in_a_random_order_find_room_three_moves_away(device, seed, fast_rows):
    """Tables (2^14 slots) whose random-order restore lost keys with chains of one or two
    moves: 1 key (seed 2) and 5 (seed 9). A chain of three moves (tile_room.h
    tile_room_chain<3>) finds room for every key, and each key keeps its own row, moved
    across tiers in the hybrid table."""
    capacity = 1 << 14
    keys, rows = _saved(_filled(device, fast_rows, seed=seed, capacity=capacity))
    perm = torch.randperm(keys.numel(), generator=torch.Generator().manual_seed(3))
    keys, rows = keys[perm.to(device)], rows[perm.to(device)]
    restored = _table(device, fast_rows, capacity=capacity)
    stats = restored.restore(keys, rows[:, :DIM], rows[:, DIM:])
    assert stats.failed == 0 and restored.size() == keys.numel()
    found = restored.export_batch(0, restored.capacity(), include_extra=True)
    order_saved, order_found = torch.argsort(keys), torch.argsort(found[0])
    assert torch.equal(found[0][order_found], keys[order_saved])
    assert torch.equal(found[1][order_found], rows[order_saved])


@pytest.mark.parametrize("buckets", [2, 5, 16, 31])
def test_a_table_of_few_buckets_restores_more_keys_than_fit(device, buckets):
    """The room search's reach (2 * kSecondBucketSpan buckets either side of a key's two)
    wraps around a table of fewer buckets than that: every bucket is in reach, once. A
    restore of the saved keys and as many new ones again fills the table and reports
    each key left out, none of them with a free slot in either of its buckets."""
    bucket = 16
    keys, rows = _saved(_filled(device, seed=buckets, capacity=buckets * bucket, bucket=bucket))
    g = torch.Generator().manual_seed(buckets)
    extra = torch.randint(1 << 62, (1 << 62) + (1 << 40), (keys.numel(),), generator=g)
    keys = torch.cat([keys, extra.to(device)])
    rows = torch.cat([rows, torch.randn(extra.numel(), DIM + 2, generator=g).to(device)])
    restored = _table(device, capacity=buckets * bucket, bucket=bucket)
    stats = restored.restore(keys, rows[:, :DIM], rows[:, DIM:])
    assert restored.size() == buckets * bucket  # full: moves found room while any was
    kept = restored.contains(keys)
    lost = keys[~kept]
    assert lost.numel() == stats.failed == keys.numel() - restored.size()
    assert all(ref.window_full(restored, int(k)) for k in lost.cpu().tolist())
    values, _ = restored.find(keys[kept])
    assert torch.equal(values, rows[kept][:, :DIM])  # each key its own row, moved or not


def _module():
    options = DynamicEmbTableOptions(
        dim=DIM, max_capacity=CAPACITY, init_capacity=CAPACITY, bucket_capacity=BUCKET,
        score_strategy=S.NO_EVICTION,
    )  # fmt: skip
    return BatchedDynamicEmbeddingTables(
        [options], [0], pooling_mode=DynamicEmbPoolingMode.NONE,
        optimizer=EmbOptimType.ADAM, learning_rate=0.1, table_names=["t"],
    )  # fmt: skip


@pytest.mark.parametrize("fmt", ["dynemb", "dynamicemb"])
def test_a_checkpoint_of_a_full_no_eviction_table_loads_every_key(fmt):
    saved = _module()
    g = torch.Generator().manual_seed(0)
    while saved.tables[0].last_stats is None or not saved.tables[0].last_stats.failed:
        keys = torch.randint(0, 1 << 62, (CAPACITY // 64,), generator=g).unique()
        saved(keys, torch.arange(keys.numel() + 1)).sum().backward()
    with tempfile.TemporaryDirectory() as d:
        DynamicEmbDump(Path(d) / "ckpt", saved, optim=True, format=fmt)
        loaded = _module()
        DynamicEmbLoad(Path(d) / "ckpt", loaded, optim=True)  # raised RowsDroppedError
    a, b = (m.tables[0] for m in (saved, loaded))
    assert b.size() == a.size() > 0.95 * CAPACITY
    ka, ra, _, _ = a.export_batch(0, a.capacity(), include_extra=True)
    kb, rb, _, _ = b.export_batch(0, b.capacity(), include_extra=True)
    oa, ob = torch.argsort(ka), torch.argsort(kb)
    assert torch.equal(ka[oa], kb[ob])
    assert torch.equal(ra[oa], rb[ob])
