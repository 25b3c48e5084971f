"""A dynamic table sharded column-wise over 2 real gloo ranks, beside a row-wise one:
every slice holds the same keys with the same scores through 10 steps with evictions,
and outputs, rows and optimizer state equal an unsharded BatchedDynamicEmbeddingTables
holding each slice as a table of its own. The slices side by side are the whole table
unsharded: its first outputs under every optimizer (new rows are the whole rows'
columns), and its outputs and rows throughout under the element-wise SGD and Adam."""

import pytest
import torch

from tests.support.column_wise_workers import CW_DIM, Case, train_column_wise, train_reference
from tests.support.multiprocess import run_ranks
from tests.support.table_wise_workers import BATCH, SMALL, STEPS, entries

pytestmark = pytest.mark.no_emulated_pass(
    "TorchRec's column-wise plumbing on gloo ranks: the table ops are the emulated pass's elsewhere"
)

WORLD = 2
ATOL = 1e-6
CASES = [
    Case(optimizer, pooling)
    for optimizer in ("EXACT_SGD", "EXACT_ROWWISE_ADAGRAD", "ADAM", "FTRL")
    for pooling in ("SUM", "MEAN")
]


def _close(got, want, what: str, rtol: float = 0.0) -> None:
    torch.testing.assert_close(got, want, atol=ATOL, rtol=rtol, msg=lambda m: f"{what}: {m}")


def test_column_slices_agree_and_equal_unsharded_slices(tmp_path):
    ranks = run_ranks(train_column_wise, WORLD, CASES, str(tmp_path / "ckpt"))
    results = [r[0] for r in ranks]
    for _, refused in ranks:  # DynamicEmb's layout takes whole rows: every rank refuses
        assert "tables ['cw'] are sharded column-wise" in refused
    assert not (tmp_path / "ckpt").exists() or not any((tmp_path / "ckpt").iterdir())
    width = CW_DIM // WORLD
    for c, case in enumerate(CASES):
        reference, want_outputs, full, full_outputs = train_reference(case, WORLD)
        whole = entries(full.tables[0])
        elementwise = case.optimizer != "EXACT_ROWWISE_ADAGRAD"
        want = {n: entries(t) for n, t in zip(reference.table_names, reference.tables)}
        for rank in range(WORLD):
            outputs, tables = results[rank][c]
            for step in range(STEPS):
                rows = slice(rank * BATCH, (rank + 1) * BATCH)
                _close(outputs[step], want_outputs[step][rows], f"{case} rank {rank} step {step}")
                if step == 0 or elementwise:  # the slices' columns side by side: the table
                    what = f"{case} rank {rank} step {step}: the whole table's output"
                    _close(outputs[step][:, :CW_DIM], full_outputs[step][rows], what)
            got = tables["cw"]
            assert got["values"].shape[1] < CW_DIM + 2 * CW_DIM  # a slice, not the table
            # Every slice stores exactly the keys of slice 0, with the same scores...
            assert torch.equal(got["keys"], results[0][c][1]["cw"]["keys"]), (case, rank)
            assert torch.equal(got["scores"], results[0][c][1]["cw"]["scores"]), (case, rank)
            # ... and its own columns and optimizer state, as its unsharded table.
            mine = want[f"cw{rank}"]
            assert torch.equal(got["keys"], mine["keys"]), (case, rank)
            assert mine["keys"].numel() == SMALL, "the evicting slices must be full"
            _close(got["values"], mine["values"], f"{case} rank {rank} slice rows")
            assert got["values"][:, :width].shape == mine["values"][:, :width].shape
            if elementwise:  # ... which are the whole table's columns of those keys
                assert torch.equal(got["keys"], whole["keys"]), (case, rank)
                columns = whole["values"][:, rank * width : (rank + 1) * width]
                _close(got["values"][:, :width], columns, f"{case} rank {rank} whole rows")
        rw = torch.cat([results[r][c][1]["rw"]["keys"] for r in range(WORLD)]).sort().values
        assert torch.equal(rw, want["rw"]["keys"]), case
