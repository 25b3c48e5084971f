"""The Storage contract, checked on the built-in HashTableStorage and on the toy
DictStorage of test_caching (a user's external storage), against a dict."""

import numpy as np
import pytest
import torch

from dynemb import DynamicEmbScoreStrategy, DynamicEmbTableOptions
from dynemb.tiering import HashTableStorage, StorageSpec, make_backing_storage
from tests.support.caching_models import DictStorage

SPEC = StorageSpec(
    dim=4, state_columns=2, value_dtype=torch.float32, capacity=1024,
    score_strategy=DynamicEmbScoreStrategy.LFU, bucket_capacity=16, device=torch.device("cpu"),
)  # fmt: skip


def _built_in():
    return make_backing_storage(
        DynamicEmbTableOptions(dim=4, max_capacity=1024, score_strategy=SPEC.score_strategy), SPEC
    )


@pytest.mark.parametrize("make", [_built_in, lambda: DictStorage(SPEC)], ids=["built_in", "dict"])
def test_storage_contract(make):
    storage = make()
    rng = np.random.default_rng(0)
    want = {}
    for _ in range(5):
        keys = torch.from_numpy(rng.choice(300, 60, replace=False) - 150).to(torch.int64)
        rows = torch.from_numpy(rng.standard_normal((60, SPEC.row_width)).astype(np.float32))
        scores = torch.from_numpy(rng.integers(0, 1000, 60)).to(torch.int64)
        dropped = storage.insert(keys, rows, scores)
        assert dropped[0].numel() == 0  # room for every key
        want.update({k: (r, s) for k, r, s in zip(keys.tolist(), rows, scores.tolist())})
        gone = keys[:5]
        assert storage.erase(gone) == 5
        for k in gone.tolist():
            del want[k]
    assert storage.size() == len(want)
    probe = torch.arange(-160, 160, dtype=torch.int64)
    rows, scores, found = storage.find(probe)
    for i, k in enumerate(probe.tolist()):
        assert bool(found[i]) == (k in want)
        if k in want:
            assert torch.equal(rows[i], want[k][0]) and int(scores[i]) == want[k][1]
    seen, offset = {}, 0
    while offset < storage.end_offset():
        keys, rows, scores, offset = storage.export_batch(offset, 37)
        for k, r, s in zip(keys.tolist(), rows, scores.tolist()):
            assert k not in seen
            seen[k] = (r, s)
    assert seen.keys() == want.keys()
    assert all(torch.equal(seen[k][0], want[k][0]) and seen[k][1] == want[k][1] for k in want)


def test_built_in_storage_reports_what_a_full_table_drops():
    storage = _built_in()
    assert isinstance(storage, HashTableStorage)
    keys = torch.arange(3000, dtype=torch.int64)
    rows = torch.zeros((3000, SPEC.row_width))
    dropped = storage.insert(keys, rows, torch.ones(3000, dtype=torch.int64))[0]
    assert storage.size() + dropped.numel() == 3000  # every key stored or reported
    assert storage.size() <= storage.table.max_capacity()


def test_built_in_storage_drops_whole_entries():
    """What a full table drops comes back whole (key, row, score): with what stays,
    exactly the entries inserted."""
    storage = _built_in()
    n = 3000
    keys = torch.arange(n, dtype=torch.int64) * 7 - 5000
    rows = keys.to(torch.float32).unsqueeze(1) + torch.arange(SPEC.row_width) / 8
    scores = torch.randperm(n, generator=torch.Generator().manual_seed(1)) + 10
    dropped_keys, dropped_rows, dropped_scores = storage.insert(keys, rows, scores)
    assert dropped_keys.numel() > 0
    got = {}
    for k, r, s in zip(dropped_keys.tolist(), dropped_rows, dropped_scores.tolist()):
        got[k] = (r, s)
    kept_rows, kept_scores, found = storage.find(keys)
    for i, k in enumerate(keys.tolist()):
        if found[i]:
            assert k not in got
            got[k] = (kept_rows[i], int(kept_scores[i]))
    assert sorted(got) == sorted(keys.tolist())
    for i, k in enumerate(keys.tolist()):
        assert torch.equal(got[k][0], rows[i]) and got[k][1] == int(scores[i])
