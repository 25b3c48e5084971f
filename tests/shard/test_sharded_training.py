"""Sharded EBC / EC with dynamic tables on 2 and 3 real gloo ranks equal one unsharded
BatchedDynamicEmbeddingTables over 10 training steps, for every optimizer and dist_type;
and every key lives on exactly the rank its routing rule names."""

import pytest
import torch

from dynemb.shard.routing import route_keys
from tests.multiprocess import run_ranks
from tests.sharded_workers import (
    FEATURES,
    NUM_EMBEDDINGS,
    STEPS,
    Case,
    train_reference,
    train_sharded,
)

OPTIMIZERS = ["EXACT_SGD", "EXACT_ADAGRAD", "EXACT_ROWWISE_ADAGRAD", "ADAM"]
DIST_TYPES = ["continuous", "roundrobin", "hash_roundrobin"]
ATOL = 1e-5


def _ebc_cases() -> list[Case]:
    cases = []
    for i, opt in enumerate(OPTIMIZERS):
        for j, dist_type in enumerate(DIST_TYPES):
            # Weighted MEAN is left out: row-wise, TorchRec divides by the sum of the
            # weights (its mean callback), the unsharded TBE by the length.
            pooling = "MEAN" if (i + j) % 2 else "SUM"
            cases.append(Case(opt, dist_type, pooling, weighted=pooling == "SUM" and j != 1))
    # The planner's plan (per-rank capacities, aligned buckets) trains the same.
    return cases + [Case("EXACT_ROWWISE_ADAGRAD", "hash_roundrobin", "SUM", planner=True)]


def _ec_cases() -> list[Case]:
    cases = [Case(opt, dt, "NONE") for opt in OPTIMIZERS for dt in DIST_TYPES]
    # use_index_dedup: one lookup per distinct raw id (TorchRec's dedup assumes ids < num_embeddings)
    return cases + [
        Case(opt, dt, "NONE", index_dedup=True) for opt, dt in zip(OPTIMIZERS, DIST_TYPES)
    ]


def _check(cases, batch_sizes, results):
    world_size = len(batch_sizes)
    starts = [sum(batch_sizes[:r]) for r in range(world_size)]
    for c, case in enumerate(cases):
        reference, ref_outputs = train_reference(case, batch_sizes, world_size)
        for rank in range(world_size):
            outputs, keys, rows = results[rank][c]
            a, b = starts[rank], starts[rank] + batch_sizes[rank]
            for step in range(STEPS):
                got, want = outputs[step], ref_outputs[step]
                if case.pooling == "NONE":
                    want = _sequence_slice(case, step, want, batch_sizes, a, b)
                    for f, name in enumerate(FEATURES):
                        torch.testing.assert_close(
                            got[f],
                            want[f],
                            atol=ATOL,
                            rtol=0,
                            msg=lambda m, case=case, rank=rank, step=step, name=name: (
                                f"{case} rank {rank} step {step} {name}: {m}"
                            ),
                        )
                else:
                    torch.testing.assert_close(
                        got,
                        want[a:b],
                        atol=ATOL,
                        rtol=0,
                        msg=lambda m, case=case, rank=rank, step=step: (
                            f"{case} rank {rank} step {step}: {m}"
                        ),
                    )
        _check_rows(case, reference, [results[r][c] for r in range(world_size)])


def _sequence_slice(case, step, out, batch_sizes, a, b):
    from tests.sharded_workers import global_batch

    lengths, _, _ = global_batch(step, sum(batch_sizes), case.weighted)
    per_feature = lengths.sum(1).tolist()
    chunks = torch.split(out, per_feature)
    return [
        chunks[f][int(lengths[f, :a].sum()) : int(lengths[f, :b].sum())]
        for f in range(len(FEATURES))
    ]


def _check_rows(case, reference, rank_results):
    """Each key is held by exactly its owner, with the reference's trained row."""
    world_size = len(rank_results)
    keys = rank_results[0][1]
    for t, name in enumerate(["t0", "t1"]):
        want_rows, want_found = reference.tables[t].find(keys)
        owner, _ = route_keys(keys, case.dist_type, world_size, NUM_EMBEDDINGS)
        held = torch.zeros(keys.numel(), dtype=torch.int64)
        for rank, (_, rank_keys, rows) in enumerate(rank_results):
            assert torch.equal(rank_keys, keys)
            values, found = rows[name]
            assert torch.equal(found, found & (owner == rank)), (
                f"{case} {name}: a key on a non-owner rank {rank}"
            )
            held += found.long()
            torch.testing.assert_close(values[found], want_rows[found], atol=ATOL, rtol=0)
        assert torch.equal(held.bool(), want_found), f"{case} {name}: keys lost or invented"
        assert bool((held <= 1).all())


@pytest.mark.parametrize("batch_sizes", [[3, 5], [4, 0, 2]], ids=["2ranks", "3ranks_one_empty"])
def test_sharded_ebc_equals_reference(batch_sizes):
    cases = _ebc_cases()
    results = run_ranks(train_sharded, len(batch_sizes), cases, batch_sizes)
    _check(cases, batch_sizes, results)


@pytest.mark.parametrize("batch_sizes", [[3, 5], [4, 0, 2]], ids=["2ranks", "3ranks_one_empty"])
def test_sharded_ec_equals_reference(batch_sizes):
    cases = _ec_cases()
    results = run_ranks(train_sharded, len(batch_sizes), cases, batch_sizes)
    _check(cases, batch_sizes, results)
