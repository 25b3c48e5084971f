"""Padded keys: the de-duplication that leaves the count on the device
(``unique_keys_grouped_padded``) and the claim bounded by it
(``table_find_or_insert_slots(..., live=)``), which let a cached table's training step
read the device once for both (dynemb.table.padded_keys).

Oracle: the same op on the first ``live`` keys, sized, on a twin table: the same
slots, statuses, counts, evicted keys and table bits; nothing past ``live`` is read
or written. Bad ``live`` is refused by name before anything changes (its value where
the executor's checks read values, the CPU executor's; the CUDA executors bound it).
"""

import pytest
import torch

import dynemb
from dynemb import DynamicEmbScoreStrategy, _ops
from dynemb._host_reads import host_reads, read_to_host
from dynemb.table.padded_keys import padded_distinct_keys
from dynemb.tiering.factory import make_table

DIM = 4
STEP = DynamicEmbScoreStrategy.STEP.value


def _table():
    """A STEP table of 64 rows in buckets of 16: 40 new keys a batch evict."""
    return dynemb.ScoredHashTable(
        dim=DIM, capacity=64, bucket_capacity=16, score_strategy=DynamicEmbScoreStrategy.STEP
    )


def _claim(table, keys, batch, live=None):
    """A cache-style claim (rows untouched, evicted keys out), as CachedTable makes it."""
    evicted = torch.full_like(keys, -7)
    policy = _ops.Policy(STEP, batch, 0, _ops.EVICT_ANY, DIM, batch, batch)
    slots, status, counts = _ops.table_find_or_insert_slots(
        table.buffers.tensors(), policy, table.state.init, keys, None, None,
        init_rows=False, evicted_keys=evicted, live=live,
    )  # fmt: skip
    return slots, status, counts, evicted


def _same_tables(a, b) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a.buffers.tensors(), b.buffers.tensors()))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_padded_claim_is_the_claim_of_its_live_keys(seed):
    g = torch.Generator().manual_seed(seed)
    padded_table, sized_table = _table(), _table()
    evictions = 0
    for batch in range(1, 9):
        u = int(torch.randint(1, 48, (1,), generator=g))
        keys = torch.randperm(200, generator=g)[:u].to(torch.int64)
        # the tail: other keys, some stored, which a claim past `live` would change
        tail = torch.randint(0, 400, (int(torch.randint(0, 30, (1,), generator=g)),), generator=g)
        padded = torch.cat([keys, tail])
        got = _claim(padded_table, padded, batch, live=torch.tensor([u]))
        want = _claim(sized_table, keys, batch)
        for name, i in (("slots", 0), ("status", 1), ("evicted keys", 3)):
            assert torch.equal(got[i][:u], want[i]), (batch, name)
        assert torch.equal(got[2], want[2]), "the counts omit the padding"
        assert bool((got[3][u:] == -7).all()), "no evicted key written past live"
        assert _same_tables(padded_table, sized_table), batch
        evictions += int(want[2][_ops.Status.EVICTED])
    assert evictions > 0  # the claims evicted


def test_a_claim_of_no_live_keys_changes_nothing():
    table, before = _table(), _table()
    _claim(table, torch.arange(10), 1)
    _claim(before, torch.arange(10), 1)
    _, _, counts, evicted = _claim(table, torch.arange(100, 120), 2, live=torch.tensor([0]))
    assert counts.tolist() == [0, 0, 0, 0]
    assert bool((evicted == -7).all())
    assert _same_tables(table, before)


def test_live_out_of_range_is_refused_or_bounded():
    """The CPU executor reads ``live`` and refuses a count outside [0, n]; a CUDA
    executor cannot without a read, and bounds it (core live_keys) instead."""
    table, twin = _table(), _table()
    keys = torch.arange(5, dtype=torch.int64)
    if dynemb.executor() == "cpu":
        for bad in (6, -1):
            with pytest.raises(ValueError, match=rf"`live` must be in \[0, 5\].*got {bad}"):
                _claim(table, keys, 1, live=torch.tensor([bad]))
        assert _same_tables(table, twin), "nothing changed"
        return
    got = _claim(table, keys, 1, live=torch.tensor([9]))
    want = _claim(twin, keys, 1)
    assert all(torch.equal(a, b) for a, b in zip(got, want)) and _same_tables(table, twin)
    _, _, counts, _ = _claim(table, keys + 50, 2, live=torch.tensor([-3]))
    assert counts.tolist() == [0, 0, 0, 0] and _same_tables(table, twin)


@pytest.mark.parametrize(
    "live, error, match",
    [
        (torch.tensor([2], dtype=torch.int32), TypeError, "`live` must have dtype Long"),
        (torch.tensor(2), ValueError, "`live` must be 1-D"),
        (torch.tensor([2, 3]), ValueError, "`live` must hold one count, got 2 elements"),
        (torch.tensor([5, 2])[1:], None, None),  # a view: fine when contiguous
    ],
)
def test_bad_live_is_refused_before_anything_changes(live, error, match):
    table, twin = _table(), _table()
    keys = torch.arange(5, dtype=torch.int64)
    if error is None:
        _claim(table, keys, 1, live=live)
        _claim(twin, keys[:2], 1)
        assert _same_tables(table, twin)
        return
    with pytest.raises(error, match=match):
        _claim(table, keys, 1, live=live)
    assert _same_tables(table, twin)


def test_padded_dedup_is_the_dedup_in_its_first_count_entries():
    g = torch.Generator().manual_seed(4)
    keys = [
        torch.randint(0, 50, (300,), generator=g),
        torch.zeros(0, dtype=torch.int64),
        torch.randint(-(2**62), 2**62, (40,), generator=g).repeat(3),
        torch.tensor([7]),
    ]
    unique, inverse, counts, num_unique = _ops.unique_keys_grouped_padded(keys)
    want = list(zip(*_ops.unique_keys_grouped(keys)))
    assert num_unique.tolist() == [w[0].numel() for w in want]
    for t, k in enumerate(keys):
        u = want[t][0].numel()
        assert unique[t].numel() == counts[t].numel() == inverse[t].numel() == k.numel()
        assert torch.equal(unique[t][:u], want[t][0]) and torch.equal(counts[t][:u], want[t][2])
        assert torch.equal(inverse[t], want[t][1]), t
    with pytest.raises(ValueError, match="needs at least one keys tensor"):
        _ops.unique_keys_grouped_padded([])


def test_padded_keys_are_sized_by_one_read_with_the_next():
    """PaddedKeys.sized() reads the counts of every table of the call once: by the
    next read of the device when one comes first (then no read of its own)."""
    keys = [torch.tensor([3, 1, 3, 2]), torch.tensor([5, 5])]
    padded = padded_distinct_keys(keys)
    before = host_reads()
    read_to_host(torch.ones(1), "another read")  # takes the counts along
    sized = [p.sized() for p in padded]
    assert host_reads() - before == 1
    assert [s[0].tolist() for s in sized] == [[3, 1, 2], [5]]
    assert [s[2].tolist() for s in sized] == [[2, 1, 1], [2]]
    alone = padded_distinct_keys(keys)[1]
    before = host_reads()
    assert alone.count() == 1 and host_reads() - before == 1  # read now, counted


def _cached_table():
    """A cache of 64 rows before a slow table of 1,024."""
    options = dynemb.DynamicEmbTableOptions(
        dim=DIM, max_capacity=1024, caching=True, local_hbm_for_values=64 * DIM * 4,
        embedding_dtype=torch.float32,
    )  # fmt: skip
    return make_table("t", options, state_columns=0, device=torch.device("cpu"))


@pytest.mark.parametrize("held", [True, False])
def test_a_cache_looks_padded_keys_up_as_their_sized_keys(held):
    """CachedTable.find_or_insert_slots of a forward's PaddedKeys: the slots, stats and
    both tiers of a twin table given the sized keys, batch after batch (the cache
    evicts to its slow tier); under a hold, or as a one-off lookup."""
    padded_table, sized_table = _cached_table(), _cached_table()
    assert padded_table.takes_padded_keys
    g = torch.Generator().manual_seed(3)
    for _ in range(6):
        indices = torch.randint(0, 150, (90,), generator=g)
        [padded] = padded_distinct_keys([indices])
        keys, _, accesses = _ops.unique_keys(indices)
        results = []
        for table, k, a in ((padded_table, padded, None), (sized_table, keys, accesses)):
            hold = table.begin_batch() if held else None
            results.append(table.find_or_insert_slots(k, a, hold))
            if held:
                table.end_batch(hold)
        (got, got_stats), (want, want_stats) = results
        assert torch.equal(got, want)
        assert got_stats.hits == want_stats.hits and got_stats.inserted == want_stats.inserted
    assert padded_table.stats.written_back == sized_table.stats.written_back > 0
    for a, b in zip(padded_table.buffers.tensors(), sized_table.buffers.tensors()):
        assert torch.equal(a, b)
    assert padded_table.persistent_table().size() == sized_table.persistent_table().size()
    both = torch.arange(150, dtype=torch.int64)
    assert torch.equal(padded_table.read_rows(both)[0], sized_table.read_rows(both)[0])
