"""The row invariants of test_row_invariants.py on a row-wise sharded
EmbeddingCollection over 1 and 2 real gloo ranks, with the sharder's index dedup on
and off: every lookup reads its own key's row, every row moves by its own key's
gradient only, and a stored row stays unless a new key took its place."""

import pytest

from dynemb import DynamicEmbScoreStrategy
from tests.support.multiprocess import run_ranks
from tests.support.row_invariant_workers import train_checked

S = DynamicEmbScoreStrategy
SPAWNED = pytest.mark.no_emulated_pass("spawned ranks: the sharding and dedup are Python")


@SPAWNED
@pytest.mark.parametrize("world_size", [1, 2])
@pytest.mark.parametrize("index_dedup", [False, True], ids=["dedup_off", "dedup_on"])
@pytest.mark.parametrize("strategy", [S.LFU, S.TIMESTAMP], ids=["LFU", "TIMESTAMP"])
def test_sharded_rows_stay_their_keys_own(strategy, index_dedup, world_size):
    checked = run_ranks(train_checked, world_size, strategy, index_dedup, 3)
    assert all(n > 0 for n in checked)
