"""Growth in chunks (growth._rehash_in_chunks): every entry keeps its row, score and
findability whatever the chunk size; a rehash that fails in a later chunk leaves the
table as it was (the rows freed by the earlier chunks restored); and the process's
peak memory during a growth stays near the new table, not old + new."""

import json
import subprocess
import sys
import textwrap

import pytest
import torch

import dynemb
from dynemb import DynamicEmbScoreStrategy as S
from dynemb import _ops
from dynemb.table import growth, table_storage
from tests.support.reference import SECOND_BUCKET_SPAN, hash_key, mix64

M64 = 2**64
_C1, _C2 = 0xFF51AFD7ED558CCD, 0xC4CEB9FE1A85EC53


def _unmix(h: int) -> int:
    """The key whose hash (csrc/core/hash.h mix64) is ``h``: x ^= x >> 33 is its own
    inverse, and each multiplier has one mod 2**64."""
    h ^= h >> 33
    h = h * pow(_C2, -1, M64) % M64
    h ^= h >> 33
    h = h * pow(_C1, -1, M64) % M64
    h ^= h >> 33
    return h - M64 if h >= 2**63 else h


def _rows(keys: torch.Tensor, dim: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(int(keys.sum()) & 0xFFFF)
    return torch.randn(keys.numel(), dim, generator=g)


def _contents(t: dynemb.ScoredHashTable):
    keys, values, scores, _ = t.export_batch(0, t.capacity())
    order = torch.argsort(keys)
    return keys[order], values[order], None if scores is None else scores[order]


@pytest.mark.parametrize("strategy", [S.NO_EVICTION, S.LFU])
@pytest.mark.parametrize("chunk_rows", [16, 48, 1 << 20])
def test_growth_in_chunks_keeps_every_entry(monkeypatch, strategy, chunk_rows):
    """Chunks of one bucket, of several and the whole table: the same entries (key,
    row, score) as a table grown in one chunk, each found where find looks."""
    tables = {}
    monkeypatch.setattr(growth, "GROWTH_CHUNKS", 1)  # chunks of chunk_rows rows exactly
    for rows in (chunk_rows, 1 << 30):
        monkeypatch.setattr(growth, "GROWTH_CHUNK_ROWS", rows)
        t = dynemb.ScoredHashTable(
            dim=5, capacity=2**15, init_capacity=256, bucket_capacity=16, score_strategy=strategy
        )
        g = torch.Generator().manual_seed(7)
        for _ in range(8):
            keys = torch.randint(-(2**63), 2**63 - 1, (700,), generator=g)
            t.insert_or_assign(keys, _rows(keys, 5))
            assert t.last_stats.failed == 0 and t.last_stats.evicted == 0
        assert t.capacity() > 256 * 8
        tables[rows] = t
    chunked, whole = tables[chunk_rows], tables[1 << 30]
    # Capacities may differ: chunks place keys in another order (either is the rule's),
    # so a later batch may fail on other keys, and growth aims at the count stored then.
    assert chunked.size() == whole.size()
    for a, b in zip(_contents(chunked), _contents(whole)):
        assert (a is None and b is None) or torch.equal(a, b)
    keys, values, _ = _contents(chunked)
    found, hit = chunked.find(keys)
    assert bool(hit.all()) and torch.equal(found, values)


def _table_of_64_buckets() -> dynemb.ScoredHashTable:
    """A NO_EVICTION table of 64 buckets of 16 slots (1,024), dim 16, that may grow."""
    return dynemb.ScoredHashTable(
        dim=16, capacity=2**14, init_capacity=64 * 16, bucket_capacity=16,
        score_strategy=S.NO_EVICTION,
    )  # fmt: skip


@pytest.mark.parametrize("chunk_rows, chunk_slots", [(1 << 16, 64), (32, 32)])
def test_a_chunk_moves_at_most_a_sixteenth_of_the_table(monkeypatch, chunk_rows, chunk_slots):
    """A chunk's new rows are faulted in before its old rows are freed, so a chunk is
    at most 1/GROWTH_CHUNKS (16) of the old table: 64 of 1024 slots, not the
    GROWTH_CHUNK_ROWS of a large table; fewer when GROWTH_CHUNK_ROWS says so."""
    monkeypatch.setattr(growth, "GROWTH_CHUNK_ROWS", chunk_rows)
    rehash, chunks = _ops.table_rehash, []
    keys_at = _ops.TABLE_TENSORS.index("keys")

    def counted(old, new, window):
        chunks.append((old[keys_at].numel(), new[keys_at].numel()))
        return rehash(old, new, window)

    monkeypatch.setattr(_ops, "table_rehash", counted)
    t = _table_of_64_buckets()
    keys = torch.randint(-(2**63), 2**63 - 1, (1000,), generator=torch.Generator().manual_seed(6))
    t.insert_or_assign(keys, _rows(keys, 16))
    assert t.last_stats.failed == 0 and t.capacity() > 1024
    first = [old for old, new in chunks if new == chunks[0][1]]
    assert first == [chunk_slots] * (1024 // chunk_slots), chunks
    found, hit = t.find(keys)
    assert bool(hit.all()) and torch.equal(found, _rows(keys, 16))


def _keys_of_pair(high: int, offset: int, n: int) -> list[int]:
    """n keys whose hash has the high word ``high`` (so one home bucket in any table)
    and whose second bucket is ``offset`` buckets past it (tables of 17+ buckets)."""
    keys, low = [], 0
    while len(keys) < n:
        h = (high << 32) | low
        h2 = mix64(h ^ 0x9E3779B97F4A7C15) >> 32
        if 1 + ((h2 * SECOND_BUCKET_SPAN) >> 32) == offset:
            keys.append(_unmix(h))
        low += 1
    return keys


def test_a_rehash_failing_in_a_later_chunk_leaves_the_table_as_it_was(monkeypatch):
    """32 keys of one hash high word and one second-bucket offset (8) fill old bucket 61
    of 64 and its second, bucket 5; a key of old bucket 60 with the same offset lands,
    after growth to 80 buckets (the least growth, 5/4), in the same new pair (home 76,
    second 4): the pair cannot hold the 33, and no entry of it has room in its other
    bucket (other keys' buckets lie elsewhere), so the rehash fails in the chunk of
    bucket 61, after the chunks of buckets 0-59 were moved and freed. Their rows come
    back."""
    monkeypatch.setattr(growth, "GROWTH_CHUNK_ROWS", 64)  # 4 buckets a chunk
    t = _table_of_64_buckets()
    assert t.num_buckets == 64
    edge = 61 << 26  # hash >> 32 where bucket 61 of 64 begins (76.25 of 80)
    g = torch.Generator().manual_seed(3)
    filler = torch.randint(-(2**63), 2**63 - 1, (1200,), generator=g)
    homes = [(hash_key(int(k)) >> 32) * 64 >> 32 for k in filler.tolist()]
    # Homes 16-39: their buckets (old and new) lie clear of both pairs.
    filler = filler[torch.tensor([16 <= h < 40 for h in homes])][:300]
    late = torch.tensor(_keys_of_pair(edge - 1, 8, 1))  # bucket 60, new home 76
    crowd = torch.tensor(_keys_of_pair(edge, 8, 33))  # bucket 61, new home 76
    keys = torch.cat([filler, late, crowd[:32]])
    t.insert_or_assign(keys, _rows(keys, 16))
    assert t.last_stats.failed == 0 and t.capacity() == 1024
    before = _contents(t)

    stats = t.insert_or_assign(crowd[32:], _rows(crowd[32:], 16))  # a full pair: grow

    assert stats.failed == 1 and t.capacity() == 1024 and t.size() == keys.numel()
    after = _contents(t)
    assert torch.equal(after[0], before[0]) and torch.equal(after[1], before[1])
    found, hit = t.find(keys)
    assert bool(hit.all()) and torch.equal(found, _rows(keys, 16))


def test_an_error_between_chunks_leaves_the_table_as_it_was(monkeypatch):
    """An exception (an interrupt, say) after some chunks were moved and freed: their
    rows come back, the error propagates, and the table is as before the growth."""
    monkeypatch.setattr(growth, "GROWTH_CHUNK_ROWS", 64)
    t = _table_of_64_buckets()
    keys = torch.randint(-(2**63), 2**63 - 1, (700,), generator=torch.Generator().manual_seed(4))
    t.insert_or_assign(keys, _rows(keys, 16))
    assert t.capacity() == 1024
    before = _contents(t)
    release, calls = table_storage.TableStorage.release_rows, []

    def release_then_interrupt(self, end):
        release(self, end)  # the pages really go
        calls.append(end)
        if len(calls) == 3:
            raise KeyboardInterrupt

    monkeypatch.setattr(table_storage.TableStorage, "release_rows", release_then_interrupt)
    more = torch.randint(-(2**63), 2**63 - 1, (400,), generator=torch.Generator().manual_seed(5))
    with pytest.raises(KeyboardInterrupt):
        t.insert_or_assign(more, _rows(more, 16))
    assert calls[-1] > 0 and t.capacity() == 1024
    # The batch's op ran before the growth: the keys it stored stand beside the old ones.
    found, hit = t.find(keys)
    assert bool(hit.all()) and torch.equal(found, before[1][torch.searchsorted(before[0], keys)])
    found, hit = t.find(more)
    assert 0 < int(hit.sum()) < more.numel()
    assert torch.equal(found[hit], _rows(more, 16)[hit])


_PEAK_SCRIPT = textwrap.dedent(
    """
    import json, sys, torch, dynemb
    from dynemb.table import growth, table_storage

    growth.GROWTH_CHUNK_ROWS = int(sys.argv[1])
    growth.GROWTH_CHUNKS = 1  # chunks of argv[1] rows
    init_slots = int(sys.argv[2])

    def status(field):
        for line in open("/proc/self/status"):
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024

    t = dynemb.ScoredHashTable(
        dim=16, capacity=4 * init_slots, init_capacity=init_slots, bucket_capacity=128,
        score_strategy=dynemb.DynamicEmbScoreStrategy.NO_EVICTION,
    )
    n, batch = 0, 2**16
    rows = torch.randn(batch, 16)
    while True:  # fill to just below the first growth
        keys = torch.randint(-(2**63), 2**63 - 1, (batch,))
        before = t.capacity()
        snapshot_rss = status("VmRSS")
        open("/proc/self/clear_refs", "w").write("5")  # VmHWM := VmRSS
        t.insert_or_assign(keys, rows)
        if t.capacity() != before:
            break
    print(json.dumps({"rss_before": snapshot_rss, "peak": status("VmHWM"),
                      "new_table": t.memory_usage(), "old_table": before}))
    """
)


def _growth_peak(chunk_rows: int, init_slots: int) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", _PEAK_SCRIPT, str(chunk_rows), str(init_slots)],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.no_emulated_pass(
    "host RSS of growth.py's chunk loop, the same Python on every executor (a GPU's rows "
    "are not in RSS); its chunk ops run on both executors in this file's other tests"
)
def test_growth_in_chunks_peaks_near_the_new_table_not_old_plus_new():
    """RSS rise during the batch that grows a 2M-slot table to 2.6M slots, in a fresh
    process: in one chunk old and new rows stand side by side (the rise is the whole
    new table); in chunks of 2**18 rows the old rows go as the new ones come (the
    rise is the new key metadata and the extra rows, well under half the new table)."""
    try:
        open("/proc/self/clear_refs", "w").write("5")
    except OSError:
        pytest.skip("this kernel cannot reset the peak RSS")
    init_slots = 2**21
    whole = _growth_peak(1 << 40, init_slots)
    chunked = _growth_peak(init_slots // 8, init_slots)
    rise_whole = whole["peak"] - whole["rss_before"]
    rise_chunked = chunked["peak"] - chunked["rss_before"]
    new = chunked["new_table"]
    assert rise_whole > 0.8 * new, (rise_whole, new)
    assert rise_chunked < 0.5 * new, (rise_chunked, new)


_RSS_SCRIPT = textwrap.dedent(
    """
    import json, torch, dynemb

    def rss():
        for line in open("/proc/self/status"):
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024

    warm = dynemb.ScoredHashTable(dim=16, capacity=4096, bucket_capacity=128)
    warm.insert_or_assign(torch.arange(1024), torch.zeros(1024, 16))  # the ops' first use
    del warm
    base = rss()
    t = dynemb.ScoredHashTable(
        dim=16, capacity=2**21, init_capacity=2**16, bucket_capacity=128,
        score_strategy=dynemb.DynamicEmbScoreStrategy.NO_EVICTION,
    )
    rows, after = torch.randn(2**14, 16), []
    for start in range(0, 3 * 2**18, 2**14):
        before = t.capacity()
        t.insert_or_assign(torch.arange(start, start + 2**14) * 0x9E3779B97F4A7C15 % 2**61, rows)
        if t.capacity() != before:
            after.append([rss() - base, t.memory_usage()])
    print(json.dumps(after))
    """
)


@pytest.mark.no_emulated_pass(
    "host RSS after growth.py's chunk loop: the same Python on every executor"
)
def test_rss_after_each_growth_is_the_table_not_the_heaps_leftovers():
    """Eleven growths from 2^16 slots to 3 * 2^18 keys, in a fresh process: after the
    last one the process holds the table, not the key metadata of the tables before
    it, which glibc would keep in its heap (its mmap threshold rises with each block
    freed) but growth gives back (table_storage.trim_host_heap). Without that the last
    growth left 1.18x the table (1.06x with it). The first ones, of tables of 4-16 MB,
    are not checked: the growth's code pages and the batch's buffers weigh there."""
    out = subprocess.run(
        [sys.executable, "-c", _RSS_SCRIPT], check=True, capture_output=True, text=True
    )
    growths = json.loads(out.stdout.strip().splitlines()[-1])
    assert len(growths) >= 8, growths
    rss, table = growths[-1]
    assert rss < 1.12 * table, growths
