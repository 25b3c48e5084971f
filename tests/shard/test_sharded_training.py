"""Sharded EBC / EC with dynamic tables on 2 and 3 real gloo ranks equal one unsharded
BatchedDynamicEmbeddingTables over 10 training steps, for every optimizer and dist_type;
and every key lives on exactly the rank its routing rule names."""

import pytest

from tests.support.multiprocess import run_ranks
from tests.support.sharded_checks import check_sharded_training
from tests.support.sharded_workers import (
    Case,
    train_sharded,
)

OPTIMIZERS = ["EXACT_SGD", "EXACT_ADAGRAD", "EXACT_ROWWISE_ADAGRAD", "ADAM", "FTRL"]
DIST_TYPES = ["continuous", "roundrobin", "hash_roundrobin"]


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


@pytest.mark.parametrize("batch_sizes", [[3, 5], [4, 0, 2]], ids=["2ranks", "3ranks_one_empty"])
def test_sharded_ebc_equals_reference(batch_sizes):
    cases = _ebc_cases()
    results = run_ranks(train_sharded, len(batch_sizes), cases, batch_sizes)
    check_sharded_training(cases, batch_sizes, results)


@pytest.mark.parametrize("batch_sizes", [[3, 5], [4, 0, 2]], ids=["2ranks", "3ranks_one_empty"])
def test_sharded_ec_equals_reference(batch_sizes):
    cases = _ec_cases()
    results = run_ranks(train_sharded, len(batch_sizes), cases, batch_sizes)
    check_sharded_training(cases, batch_sizes, results)
