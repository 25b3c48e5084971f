"""De-duplicated lookups keep their access counts.

``BatchedDynamicEmbeddingTables.forward(..., access_counts=c)`` counts index i as
``c[i]`` accesses (LFU scores, admission counters), like the batch with the index
repeated ``c[i]`` times. A sharded EC with ``use_index_dedup=True`` sends each distinct
id once with its count, so on 1 and 2 real gloo ranks every rank's tables hold the same
keys, scores and admission counts as without dedup and as one unsharded module (the
oracle); ordinary TorchRec tables beside them are unchanged by it.
"""

import pytest
import torch

from dynemb import (
    BatchedDynamicEmbeddingTables,
    DynamicEmbPoolingMode,
    DynamicEmbScoreStrategy,
    DynamicEmbTableOptions,
)
from dynemb.admission_strategies import FrequencyAdmissionStrategy, KVCounter
from tests.support.dedup_access_counts_workers import (
    STEPS,
    ordinary_tables_outputs,
    reference_tables,
    repeated_id_scores,
    tables_after_training,
    tables_state,
)
from tests.support.multiprocess import run_ranks
from tests.support.sharded_workers import global_batch, local_kjt

# ------------------------------------------------------------ the forward argument


def _module(device, caching=False, pooling=DynamicEmbPoolingMode.SUM):
    """Tables t0 (features f0, f1; LFU, optionally a cache) and t1 (feature f2; LFU
    with admission at 3 accesses)."""
    t0 = DynamicEmbTableOptions(
        dim=4, max_capacity=256, bucket_capacity=16, score_strategy=DynamicEmbScoreStrategy.LFU
    )
    if caching:
        t0.caching, t0.local_hbm_for_values = True, 32 * 4 * 4  # 32 rows (SGD: no state)
    t1 = DynamicEmbTableOptions(
        dim=4, max_capacity=256, bucket_capacity=16, score_strategy=DynamicEmbScoreStrategy.LFU,
        admit_strategy=FrequencyAdmissionStrategy(3, counter=KVCounter(capacity=64, bucket_capacity=16)),
    )  # fmt: skip
    return BatchedDynamicEmbeddingTables(
        [t0, t1], [0, 0, 1], pooling_mode=pooling, table_names=["t0", "t1"], device=device
    )


def _batch(device, bags):
    """3 features x 1 sample: ``bags`` = (f0, f1, f2) key lists -> indices, offsets."""
    lengths = torch.tensor([len(b) for b in bags])
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])
    keys = torch.tensor([k for b in bags for k in b], dtype=torch.int64)
    return keys.to(device), offsets.to(device)


@pytest.mark.parametrize("caching", [False, True], ids=["in_memory", "cached"])
@pytest.mark.parametrize("pooling", ["SUM", "NONE"])
def test_access_counts_count_like_repeated_indices(device, caching, pooling):
    mode = DynamicEmbPoolingMode[pooling]
    deduped, repeated = _module(device, caching, mode), _module(device, caching, mode)
    # Step 1: t0 sees 5 twice in f0 and four times in f1 (6 in all), 9 once; t1 sees 5
    # three times (admitted: threshold 3) and 8 twice (counted, not admitted).
    # Step 2: t0 sees 9 seven times; t1 counts 7 twice.
    steps = [(([5, 9], [5], [5, 8]), [2, 1, 4, 3, 2]), (([9], [], [7]), [7, 2])]
    for bags, counts in steps:
        keys, offsets = _batch(device, bags)
        counts = torch.tensor(counts, device=device)
        deduped(keys, offsets, access_counts=counts).sum().backward()
        keys, offsets = _batch(device, _repeated(bags, counts.tolist()))
        repeated(keys, offsets).sum().backward()
    state = tables_state(deduped)
    assert state == tables_state(repeated)
    assert state["t0"] == [(5, 6), (9, 8)]
    assert state["t1"] == [(5, 3)]
    assert state["t1 counter"] == [(7, 2), (8, 2)]


def _repeated(bags, counts):
    """``bags`` with each key repeated its count (``counts``: one per key, in order)."""
    counts = iter(counts)
    return [[k for k in bag for _ in range(next(counts))] for bag in bags]


@pytest.mark.parametrize(
    "counts, error, match",
    [
        ([1.0, 2.0, 1.0], TypeError, r"access_counts must be an int64 \(or int32\) tensor"),
        ("list", TypeError, "access_counts must be an int64 .* got list"),
        ([1, 2], ValueError, r"shape of indices \(3,\).* got \(2,\)"),
        ([[1, 2, 1]], ValueError, r"shape of indices \(3,\).* got \(1, 3\)"),
        ([1, 0, 2], ValueError, "access_counts must be >= 1 .* got 0 at index 1"),
        ([1, 1, -4], ValueError, "access_counts must be >= 1 .* got -4 at index 2"),
        ([2**62, 2**62, 1], ValueError, r"access_counts must sum to at most 2\*\*63 - 1"),
    ],
)
def test_access_counts_are_checked_before_any_change(device, counts, error, match):
    module = _module(device)
    keys, offsets = _batch(device, ([5, 9], [], [5]))
    if counts == "list":
        bad = [1, 1, 1]
    else:
        dtype = torch.float32 if isinstance(counts[0], float) else torch.int64
        bad = torch.tensor(counts, dtype=dtype, device=device)
    with pytest.raises(error, match=match):
        module(keys, offsets, access_counts=bad)
    assert [t.size() for t in module.tables] == [0, 0]
    assert module.admission_counters[1].dump()[0].numel() == 0
    # int32 counts are accepted (like int32 indices)
    module(keys, offsets, access_counts=torch.tensor([2, 1, 1], dtype=torch.int32, device=device))
    assert tables_state(module)["t0"] == [(5, 2), (9, 1)]


# ------------------------------------------------------------ sharded EC, gloo ranks


@pytest.mark.parametrize("world_size", [1, 2])
def test_repeated_id_in_a_bag_scores_as_often_as_it_appears(world_size):
    # Every rank's bag [5, 5, 5]: key 5's owner (5 mod world_size, roundrobin) counts
    # 3 accesses per rank, with dedup as without.
    results = run_ranks(repeated_id_scores, world_size)
    for rank, scores in enumerate(results):
        want = 3 * world_size if rank == 5 % world_size else 0
        assert scores == {False: want, True: want}, f"rank {rank}"


@pytest.mark.parametrize(
    "batch_sizes, dist_type",
    [([8], "roundrobin"), ([3, 5], "hash_roundrobin")],
    ids=["1rank", "2ranks"],
)
def test_dedup_keeps_scores_and_admission_counts(batch_sizes, dist_type):
    _check_batches_repeat_keys(batch_sizes)
    results = run_ranks(tables_after_training, len(batch_sizes), batch_sizes, dist_type)
    reference = reference_tables(batch_sizes, dist_type)
    for rank, by_dedup in enumerate(results):
        (plain, plain_out), (dedup, dedup_out) = by_dedup[False], by_dedup[True]
        assert dedup == plain, f"rank {rank}: tables differ with use_index_dedup"
        for step, (a, b) in enumerate(zip(plain_out, dedup_out, strict=True)):
            for f in a:
                torch.testing.assert_close(b[f], a[f], atol=1e-6, rtol=0,
                                           msg=f"rank {rank} step {step} {f}")  # fmt: skip
    for name, want in reference.items():  # every rank's share together: the oracle's
        got = sorted(pair for by_dedup in results for pair in by_dedup[True][0][name])
        assert got == want, name
    assert max(score for _, score in reference["t0"]) > STEPS  # counts, not batches


def _check_batches_repeat_keys(batch_sizes):
    """The batches test something: a rank's batch repeats keys of a table."""
    lengths, keys, _ = global_batch(0, sum(batch_sizes), weighted=False)
    kjt = local_kjt(lengths, keys, None, 0, batch_sizes[0])
    t0 = kjt.values()[: sum(kjt.length_per_key()[:2])]
    assert torch.unique(t0).numel() < t0.numel()


@pytest.mark.parametrize("world_size", [1, 2])
def test_ordinary_tables_are_unchanged_by_dedup(world_size):
    # o_rw shares the dynamic table's row-wise sharding, whose deduplicated ids carry
    # their counts as weights; o_tw is table-wise (no counts). Neither reads them.
    results = run_ranks(ordinary_tables_outputs, world_size)
    for rank, by_dedup in enumerate(results):
        (plain_out, plain_rows), (dedup_out, dedup_rows) = by_dedup[False], by_dedup[True]
        for step, (a, b) in enumerate(zip(plain_out, dedup_out, strict=True)):
            for f in a:
                torch.testing.assert_close(b[f], a[f], atol=1e-6, rtol=0,
                                           msg=f"rank {rank} step {step} {f}")  # fmt: skip
        for name, shards in plain_rows.items():
            for a, b in zip(shards, dedup_rows[name], strict=True):
                torch.testing.assert_close(b, a, atol=1e-6, rtol=0, msg=f"rank {rank} {name}")
