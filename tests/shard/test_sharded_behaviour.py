"""Dynamic tables inside TorchRec models on real gloo ranks: mixed with ordinary tables,
with empty batches everywhere, and with TorchRec's optimizer, eval and state_dict hooks."""

import pytest

from tests.support.mixed_model_workers import (
    dynamic_tables_behave_like_torchrec_tables,
    mixed_model_matches_torchrec,
)
from tests.support.multiprocess import run_ranks
from tests.support.sharded_checks import check_sharded_training
from tests.support.sharded_workers import Case, train_sharded


@pytest.mark.parametrize("world_size", [1, 2])
def test_ordinary_tables_beside_dynamic_ones_match_plain_torchrec(world_size):
    run_ranks(mixed_model_matches_torchrec, world_size)


def test_parameters_state_dict_lr_and_eval():
    run_ranks(dynamic_tables_behave_like_torchrec_tables, 2)


def test_all_ranks_empty():
    cases = [Case("EXACT_ADAGRAD", "roundrobin", "MEAN"), Case("ADAM", "continuous", "NONE")]
    batch_sizes = [0, 0]
    results = run_ranks(train_sharded, 2, cases, batch_sizes)
    for rank_result in results:
        for _, keys, _ in rank_result:
            assert keys.numel() == 0
    check_sharded_training(cases, batch_sizes, results)
