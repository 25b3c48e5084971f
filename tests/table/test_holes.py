"""A miss stops at an empty slot of the key's home line until an erase (csrc/core/bucket.h
"Holes"): no stored key sits past an empty slot of its probe order in a bucket without
the erased-slot flag, through inserts, evictions, growth and erases; an erase flags its
key's bucket, and a key past the slot it emptied is still found; a spill directory of
the previous format is converted as it opens."""

import json
import os

import pytest
import torch

import dynemb
from dynemb import DynamicEmbScoreStrategy as S
from dynemb import _ops
from dynemb.table import spill_files
from tests.support import reference as ref
from tests.support.spill_versions import rewrite_version

GROUP, LINE_GROUPS = 16, 4


def _home_group(key: int, groups: int) -> int:
    """core/hash.h home_group_of."""
    return (((ref.hash_key(key) >> 8) & 0xFFFFFF) * groups) >> 24


def _probe_position(key: int, slot: int, capacity: int) -> int:
    """The position of slot's group in the probe order of `key` (bucket.h ProbeOrder)."""
    return (slot % capacity // GROUP) ^ _home_group(key, capacity // GROUP)


def _violations(t) -> list[str]:
    """Stored keys of buckets without the flag that sit past an empty slot of their
    probe order (past a group with an empty slot)."""
    s, cap = t.buffers, t.bucket_capacity
    digests = s.digests.view(-1, cap).tolist()
    keys = s.keys.view(-1, cap).tolist()
    flags = s.overflow.tolist()
    bad = []
    for b, (row, ks) in enumerate(zip(digests, keys)):
        if flags[b] & _ops.HOLED_FLAG:
            continue
        open_groups = {i // GROUP for i, d in enumerate(row) if d == 0}
        for i, d in enumerate(row):
            if d == 0:
                continue
            home = _home_group(ks[i], cap // GROUP)
            pos = _probe_position(ks[i], b * cap + i, cap)
            if any((g ^ home) < pos for g in open_groups):
                bad.append(f"bucket {b}: key {ks[i]} at position {pos} past an empty slot")
    return bad


@pytest.mark.parametrize("strategy", [S.NO_EVICTION, S.TIMESTAMP, S.LFU])
def test_no_key_sits_past_an_empty_slot_in_a_bucket_without_an_erase(strategy):
    grows = strategy == S.NO_EVICTION
    t = dynemb.ScoredHashTable(
        dim=2, capacity=128 * (32 if grows else 8), init_capacity=128 * 8,
        bucket_capacity=128, score_strategy=strategy,
    )  # fmt: skip
    g = torch.Generator().manual_seed(7)
    pool = torch.randint(-(2**62), 2**62, (4000 if grows else 2000,), generator=g)
    erased_buckets: set[int] = set()
    for step in range(40):
        keys = pool[torch.randint(0, pool.numel(), (300,), generator=g)].unique()
        before = t.num_buckets
        if step % 3 == 2:
            slots = t.find_slots(keys)
            erased = t.erase_keys(keys)
            assert torch.equal(erased, slots >= 0)
            erased_buckets |= set((slots[erased] // t.bucket_capacity).tolist())
        else:
            t.insert_or_assign(keys, torch.zeros(keys.numel(), 2))
            if t.num_buckets != before:  # a rehash: no bucket has a hole
                erased_buckets = set()
        flagged = {b for b, f in enumerate(t.buffers.overflow.tolist()) if f & _ops.HOLED_FLAG}
        assert flagged == erased_buckets, f"step {step}"
        assert _violations(t) == [], f"step {step}"
        stored, _, _, _ = t.export_batch(0, t.capacity())
        assert bool(t.contains(stored).all()), f"step {step}: a stored key was not found"
    assert erased_buckets, "some erase should have hit a key"
    if grows:
        assert t.num_buckets > 8, "the table should have grown"


def _full_bucket():
    """A table of one bucket of 128 filled by one batch, and a stored key `past` outside
    its home line (so its home line was full as it came) with `inside`, another key
    of that line."""
    t = dynemb.ScoredHashTable(
        dim=2, capacity=128, init_capacity=128, bucket_capacity=128, score_strategy=S.TIMESTAMP
    )
    keys = torch.randint(-(2**62), 2**62, (128,), generator=torch.Generator().manual_seed(3))
    t.insert_or_assign(keys, torch.arange(256.0).view(128, 2))
    assert t.size() == 128
    slots = t.find_slots(keys).tolist()
    for k, s in zip(keys.tolist(), slots):
        if _probe_position(k, s, 128) >= LINE_GROUPS:
            home = _home_group(k, 8)
            for k2, s2 in zip(keys.tolist(), slots):
                if (s2 // GROUP ^ home) < LINE_GROUPS:
                    return t, k, k2
    raise AssertionError("a full bucket should hold a key outside its home line")


def test_an_erase_in_a_home_line_leaves_the_keys_past_it_found():
    t, past, inside = _full_bucket()
    assert t.buffers.overflow.tolist() == [0]
    assert t.erase(torch.tensor([inside])) == 1
    assert t.buffers.overflow.tolist() == [_ops.HOLED_FLAG]
    values, found = t.find(torch.tensor([past]))
    assert bool(found.all()), "a key past an erased slot of its home line must be found"
    again = t.insert_or_assign(torch.tensor([past]), torch.ones(1, 2))
    assert again.hits == 1 and t.size() == 127  # found, not stored twice


def test_a_spill_directory_of_format_2_is_converted_as_it_opens(tmp_path):
    def table():
        return dynemb.ScoredHashTable(
            dim=2, capacity=128, init_capacity=128, bucket_capacity=128,
            score_strategy=S.TIMESTAMP, spill_directory=str(tmp_path),
        )  # fmt: skip

    t, past, inside = _full_bucket()
    keys, values, _, _ = t.export_batch(0, 128)
    spilled = table()
    spilled.insert_or_assign(keys, values)
    assert spilled.erase(torch.tensor([inside])) == 1
    assert bool(spilled.contains(torch.tensor([past])).all())
    spilled.flush()
    generation = spilled.buffers.generation
    del spilled
    # As version 2 wrote it: no erased-slot flag (its overflow byte is 0 or 1).
    assert rewrite_version(str(tmp_path), 2) == spill_files.FORMAT_VERSION == 3
    flags = os.path.join(tmp_path, f"g{generation}", "overflow")
    with open(flags, "r+b") as f:
        f.write(bytes([0]))
    reopened = table()
    assert bool(reopened.contains(torch.tensor([past])).all())
    assert reopened.size() == 127
    assert reopened.buffers.overflow.tolist() == [_ops.HOLED_FLAG]
    with open(os.path.join(tmp_path, spill_files.META_FILE)) as f:
        assert json.load(f)["version"] == 3
