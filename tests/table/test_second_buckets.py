"""NO_EVICTION placement in two buckets (csrc/core/table_ops.h, "Placement"): a key
lives in its home bucket or its second (one of the 16 after it); a new key takes its
home while that is filled below 13/16, else the emptier, as its batch starts (ties:
home), a key whose pick filled during
the batch takes the other; a key in its second bucket flags its home, so finds, erases,
exports and growth reach it; tables fill to >= 0.95 before their first failed insert; a
spill directory of format 1 is refused, naming the versions it reads."""

import pytest
import torch

import dynemb
from dynemb import DynamicEmbScoreStrategy as S
from dynemb.table import spill_files
from tests.support.bucket_keys import keys_of_buckets
from tests.support.spill_versions import rewrite_version

BC, NB = 16, 8


def _table(capacity=BC * NB, init_capacity=None, **kw):
    return dynemb.ScoredHashTable(
        dim=2,
        capacity=capacity,
        init_capacity=init_capacity or capacity,
        bucket_capacity=BC,
        score_strategy=S.NO_EVICTION,
        **kw,
    )


def _buckets_of(t, keys):
    slots = t.find_slots(keys)
    assert bool((slots >= 0).all()), "every key should be stored"
    return (slots // BC).tolist()


def test_a_new_key_takes_its_home_below_13_16_then_the_emptier_and_flags_its_home():
    t = _table()
    keys = keys_of_buckets(14, NB, home=0, second=1)
    t.insert_or_assign(keys[:12], torch.zeros(12, 2))
    assert _buckets_of(t, keys[:12]) == [0] * 12  # empty pair: ties go home
    t.insert_or_assign(keys[12:13], torch.zeros(1, 2))  # home 4 free (> 3/16): home
    assert _buckets_of(t, keys[12:13]) == [0]
    assert not bool(t.buffers.overflow.any())
    t.insert_or_assign(keys[13:], torch.ones(1, 2))  # home 3 free, second 16: second
    assert _buckets_of(t, keys[13:]) == [1]
    assert t.buffers.overflow.tolist() == [1, 0, 0, 0, 0, 0, 0, 0]
    values, found = t.find(keys)
    assert bool(found.all()) and torch.equal(values[13], torch.ones(2))


def test_a_batch_chooses_from_the_table_as_it_starts():
    """20 keys of one pair in one batch: each sees both buckets empty and picks its
    home; the 4 that find it full take the second (not 10 and 10, as one key at a time
    would)."""
    t = _table()
    keys = keys_of_buckets(20, NB, home=3, second=5)
    t.insert_or_assign(keys, torch.zeros(20, 2))
    assert t.last_stats.inserted == 20
    assert _buckets_of(t, keys) == [3] * 16 + [5] * 4
    again = t.insert_or_assign(keys, torch.ones(20, 2))  # all hits, wherever they sit
    assert again.hits == 20 and _buckets_of(t, keys) == [3] * 16 + [5] * 4


def test_keys_in_second_buckets_are_erased_exported_and_survive_growth():
    t = _table(capacity=BC * 64, init_capacity=BC * NB)
    keys = keys_of_buckets(30, NB, home=2, second=4)
    rows = torch.randn(30, 2, generator=torch.Generator().manual_seed(1))
    t.insert_or_assign(keys, rows)
    assert sorted(set(_buckets_of(t, keys))) == [2, 4]
    assert t.erase(keys[20:25]) == 5  # five of those in the second bucket
    exported, values, _, _ = t.export_batch(0, t.capacity())
    order = torch.argsort(exported)
    want = torch.cat([keys[:20], keys[25:]])
    assert torch.equal(exported[order], torch.sort(want).values)
    others = torch.randint(0, 2**62, (500,), generator=torch.Generator().manual_seed(2))
    t.insert_or_assign(others, torch.zeros(500, 2))  # grows: every key is rehashed
    assert t.capacity() > BC * NB
    found_rows, found = t.find(want)
    assert bool(found.all())
    assert torch.equal(found_rows, torch.cat([rows[:20], rows[25:]]))
    assert not bool(t.contains(keys[20:25]).any())


@pytest.mark.parametrize("ids", ["random", "sequential"])
def test_a_table_fills_past_095_before_its_first_failed_insert(ids):
    slots = 1 << 16
    t = dynemb.ScoredHashTable(
        dim=1, capacity=slots, init_capacity=slots, score_strategy=S.NO_EVICTION
    )
    g = torch.Generator().manual_seed(5)
    stored, batch = 0, 1024
    for b in range(slots // batch + 1):
        if ids == "random":
            keys = torch.randint(-(2**63), 2**63 - 1, (batch,), generator=g)
        else:
            keys = torch.arange(b * batch, (b + 1) * batch)
        t.insert_or_assign(keys, torch.zeros(batch, 1))
        if t.last_stats.failed:
            break
        stored += batch
    assert t.last_stats.failed, "the table should have filled"
    assert stored / slots >= 0.95, f"first failure at load {stored / slots:.3f}"


def test_a_spill_directory_of_format_1_is_refused_naming_both_versions(tmp_path):
    t = _table(spill_directory=str(tmp_path))
    t.insert_or_assign(torch.arange(10), torch.zeros(10, 2))
    t.flush()
    del t
    assert rewrite_version(str(tmp_path), 1) == spill_files.FORMAT_VERSION == 3
    with pytest.raises(ValueError, match="format version 1, expected 3 or 2"):
        _table(spill_directory=str(tmp_path))


def test_a_growth_leaves_no_bucket_nearly_full():
    """Right after a growth (load ~0.74, ~95 keys a bucket of 128) no bucket
    holds more than 120: the rehash fills a home bucket to 7/8 and puts the rest in the
    emptier of each key's two buckets. Filled home first, bucket fills spread as a
    Poisson law's (about 1 bucket in 300 at 120 or more, full pairs among them), and a
    batch right after a growth failed at a load near 0.75."""
    slots, batch = 1 << 20, 1 << 14
    t = dynemb.ScoredHashTable(
        dim=1, capacity=2 * slots, init_capacity=slots, score_strategy=S.NO_EVICTION
    )
    g = torch.Generator().manual_seed(6)
    while t.capacity() == slots:
        keys = torch.randint(-(2**63), 2**63 - 1, (batch,), generator=g)
        t.insert_or_assign(keys, torch.zeros(batch, 1))
        assert t.last_stats.failed == 0
    fills = (t.buffers.digests != 0).sum(dim=1)
    assert t.size() / t.capacity() > 0.7
    assert int(fills.max()) <= 120, sorted(fills.tolist())[-8:]
