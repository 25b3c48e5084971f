"""Column slices that disagree are seen in the forward: a key erased from one slice of a
column-wise dynamic table (2 real gloo ranks) makes the next batch holding it raise on
every rank under safe_check_mode ERROR and warn under WARNING, naming the table and each
rank's lookup outcome; under IGNORE nothing is checked (the documented limit). Slices
that agree (10 steps that evict) are never reported. Pooled (EBC) and sequence (EC)."""

import pytest

from tests.support.column_wise_workers import lose_a_key, lose_a_key_sequence
from tests.support.multiprocess import run_ranks
from tests.support.table_wise_workers import STEPS

pytestmark = pytest.mark.no_emulated_pass(
    "safe_check_mode's comparison of lookup outcomes across ranks: Python over the "
    "ops' hit masks, which tests/tbe checks on both executors"
)

WORLD = 2
MODES = ["ERROR", "WARNING", "IGNORE"]


@pytest.mark.parametrize("mode", MODES)
def test_a_slice_that_lost_a_key_is_reported_by_safe_check_mode(mode):
    _check(run_ranks(lose_a_key, WORLD, mode, STEPS), mode, "cw", others=["rw"])


@pytest.mark.parametrize("mode", MODES)
def test_a_sequence_slice_that_lost_a_key_is_reported_by_safe_check_mode(mode):
    _check(run_ranks(lose_a_key_sequence, WORLD, mode), mode, "a", others=["b"])


def _check(ranks: list, mode: str, table: str, others: list[str]) -> None:
    for rank, (trained, error, caught) in enumerate(ranks):
        assert trained is None, f"rank {rank}: agreeing slices reported: {trained}"
        reports = [error] if mode == "ERROR" else caught
        if mode == "IGNORE":
            assert error is None and not caught, (rank, error, caught)
            continue
        assert error is None or mode == "ERROR"
        assert len(reports) == 1 and reports[0] is not None, (rank, error, caught)
        message = reports[0]
        assert f"column-wise dynamic table {table!r}: its slices disagree" in message
        assert "rank 0: hits=" in message and "rank 1: hits=" in message
        assert f"safe_check_mode {mode}" in message
        for other in others:  # a table whose slices agree (or that has none)
            assert repr(other) not in message
