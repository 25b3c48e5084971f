"""A checkpoint with more rows than an evicting table holds: the table keeps the
highest (score, digest, key) entries of each bucket and the load reports the count it
dropped (a CheckpointWarning, or a RuntimeError with ``strict=True``), never an
arbitrary subset without a word; NO_EVICTION raises."""

import warnings

import pytest
import torch

from dynemb import (
    BatchedDynamicEmbeddingTables,
    DynamicEmbDump,
    DynamicEmbLoad,
    DynamicEmbScoreStrategy,
    DynamicEmbTableOptions,
    _ops,
)
from dynemb.checkpoint import CheckpointWarning

SAVED, SMALL, BUCKET = 1500, 256, 128
LFU = DynamicEmbScoreStrategy.LFU


def _module(capacity, strategy=LFU):
    options = DynamicEmbTableOptions(
        dim=4, max_capacity=capacity, bucket_capacity=BUCKET, score_strategy=strategy
    )
    return BatchedDynamicEmbeddingTables([options], [0], table_names=["t"])


def _trained(tmp_path, layout, strategy=LFU):
    """A dump of SAVED keys; key k seen 1 + k % 5 times (LFU scores of 1..5)."""
    big = _module(4096, strategy)
    keys = torch.arange(1, SAVED + 1)
    for times in range(5):
        seen = keys[keys % 5 >= times]
        # one feature, one key per bag
        big(seen, torch.arange(seen.numel() + 1)).sum().backward()
    path = tmp_path / layout
    DynamicEmbDump(path, big, format=layout)
    return big.tables[0], path


def _entries(table):
    keys, _, scores, _ = table.export_batch(0, table.capacity())
    return dict(zip(keys.tolist(), scores.tolist()))


def _highest_per_bucket(entries: dict, num_buckets: int) -> set:
    """The oracle: per bucket, the BUCKET highest (score, digest, key)."""
    keys = torch.tensor(list(entries))
    buckets, digests = _ops.hash_keys(keys, num_buckets)
    ranked = {}
    for k, b, d in zip(keys.tolist(), buckets.tolist(), digests.tolist()):
        ranked.setdefault(b, []).append((entries[k], d, k))
    return {k for group in ranked.values() for _, _, k in sorted(group)[-BUCKET:]}


@pytest.mark.parametrize("layout", ["dynemb", "dynamicemb"])
def test_an_evicting_table_keeps_the_highest_and_warns_with_the_count(tmp_path, layout):
    saved, path = _trained(tmp_path, layout)
    small = _module(SMALL)
    with pytest.warns(CheckpointWarning, match=rf"\{{'t': {SAVED - SMALL}\}}.*strict=True"):
        DynamicEmbLoad(path, small)
    table = small.tables[0]
    kept = _entries(table)
    assert len(kept) == SMALL
    assert set(kept) == _highest_per_bucket(_entries(saved), table.num_buckets)
    assert all(kept[k] == s for k, s in _entries(saved).items() if k in kept)


@pytest.mark.parametrize("layout", ["dynemb", "dynamicemb"])
def test_strict_raises_naming_the_table_and_the_count(tmp_path, layout):
    _, path = _trained(tmp_path, layout)
    small = _module(SMALL)
    with pytest.raises(RuntimeError, match=rf"\{{'t': {SAVED - SMALL}\}}.*strict=True"):
        DynamicEmbLoad(path, small, strict=True)
    assert small.tables[0].size() == SMALL  # the rest was loaded, as under NO_EVICTION


def test_a_load_that_fits_says_nothing(tmp_path):
    _, path = _trained(tmp_path, "dynemb")
    roomy = _module(4096)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        DynamicEmbLoad(path, roomy, strict=True)
    assert roomy.tables[0].size() == SAVED


def test_no_eviction_still_raises_without_strict(tmp_path):
    _, path = _trained(tmp_path, "dynemb", DynamicEmbScoreStrategy.NO_EVICTION)
    with pytest.raises(RuntimeError, match=r"keys did not fit in their tables \(capacity\)"):
        DynamicEmbLoad(path, _module(SMALL, DynamicEmbScoreStrategy.NO_EVICTION))


def test_strict_must_be_a_bool(tmp_path):
    with pytest.raises(TypeError, match="`strict` must be a bool, got 1"):
        DynamicEmbLoad(tmp_path, _module(SMALL), strict=1)


def test_an_inference_module_keeps_every_row(tmp_path):
    from dynemb.inference.exportable_tables import InferenceEmbeddingCollection

    saved, path = _trained(tmp_path, "dynemb")
    options = DynamicEmbTableOptions(
        dim=4, max_capacity=SMALL, bucket_capacity=BUCKET, score_strategy=LFU
    )
    module = InferenceEmbeddingCollection([options], table_names=["t"])
    with warnings.catch_warnings():
        warnings.simplefilter("error", CheckpointWarning)
        module.load_from_dynamicemb_file(path)
    keys = torch.tensor(sorted(_entries(saved)))
    rows = module(keys, torch.arange(keys.numel() + 1))
    assert torch.equal(rows, saved.find(keys)[0])
