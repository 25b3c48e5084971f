"""Dynamic tables sharded table-wise beside row-wise dynamic tables and an ordinary
TorchRec table, on 2 real gloo ranks, equal one unsharded BatchedDynamicEmbeddingTables
over 10 training steps with evictions: outputs, and every table's keys, rows, optimizer
state and scores."""

import pytest
import torch

from tests.support.multiprocess import run_ranks
from tests.support.sharded_checks import sequence_slice
from tests.support.sharded_workers import Case as SeqCase
from tests.support.sharded_workers import train_reference as train_sequence_reference
from tests.support.sharded_workers import train_sharded
from tests.support.table_wise_workers import (
    SMALL,
    STEPS,
    Case,
    checkpoint_between_plans,
    entries,
    global_batch,
    train_reference,
    train_table_wise,
)

pytestmark = pytest.mark.no_emulated_pass(
    "TorchRec's table-wise plumbing on gloo ranks: the table ops are the emulated pass's elsewhere"
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


def test_table_wise_beside_row_wise_equals_unsharded():
    results = run_ranks(train_table_wise, WORLD, CASES)
    for c, case in enumerate(CASES):
        reference, want_outputs = train_reference(case, WORLD)
        for rank in range(WORLD):
            outputs, tables, _ = results[rank][c]
            for step in range(STEPS):
                want = want_outputs[step][rank * 4 : (rank + 1) * 4]
                _close(outputs[step], want, f"{case} rank {rank} step {step}")
            # The table-wise table is on its rank only, whole.
            assert ("tw" in tables) == (rank == case.tw_rank), (case, rank, sorted(tables))
        want = {n: entries(t) for n, t in zip(reference.table_names, reference.tables)}
        tw = results[case.tw_rank][c][1]["tw"]
        seen = torch.cat([global_batch(s, 4 * WORLD, 2)[1][: _first(s)] for s in range(STEPS)])
        assert want["tw"]["keys"].numel() == SMALL < seen.unique().numel(), "no eviction"
        _check_entries(tw, want["tw"], f"{case} tw")
        rw = _union([results[r][c][1]["rw"] for r in range(WORLD)])
        # Row-wise MEAN: TorchRec divides by (length + 1e-6), so the row-wise table's
        # gradients, and its accumulated optimizer state, are off by ~1e-6 relative.
        _check_entries(rw, want["rw"], f"{case} rw", 2e-6 if case.pooling == "MEAN" else 0.0)
        if case.ordinary:
            rows = results[0][c][2]  # table-wise on rank 0: the whole table
            _close(rows, want["ord"]["values"][:, : rows.shape[1]], f"{case} ordinary rows")


def _first(step: int) -> int:
    """Keys of the first feature (the table-wise table's) in step ``step``'s batch."""
    return int(global_batch(step, 4 * WORLD, 2)[0][0].sum())


def _check_entries(got: dict, want: dict, what: str, rtol: float = 0.0) -> None:
    assert torch.equal(got["keys"], want["keys"]), f"{what}: keys differ"
    assert torch.equal(got["scores"], want["scores"]), f"{what}: scores differ"
    _close(got["values"], want["values"], f"{what}: rows and optimizer state", rtol)


def _union(parts: list[dict]) -> dict:
    keys = torch.cat([p["keys"] for p in parts])
    assert keys.unique().numel() == keys.numel(), "a key on two ranks"
    order = torch.argsort(keys)
    return {f: torch.cat([p[f] for p in parts])[order] for f in parts[0]}


def test_checkpoints_move_between_row_wise_and_table_wise_plans(tmp_path):
    case = Case("ADAM", "SUM")
    results = run_ranks(checkpoint_between_plans, WORLD, case, str(tmp_path))
    saved, outputs, held, _, increments = results[0]
    for rank in range(WORLD):
        assert "tables ['tw'] are sharded table-wise" in results[rank][3], rank
    # Plan A holds tw on rank 1 only; plan B holds rw on rank 0 only.
    assert held == [["rw"], ["rw", "tw"], ["rw"]]
    assert results[1][2] == [["rw", "tw"], ["tw"], ["rw", "tw"]]
    trained, moved, back = saved
    assert trained["tw"]["keys"].numel() == SMALL
    for name in ("tw", "rw"):  # score >= 0: every entry, gathered from its ranks
        assert torch.equal(increments[name], trained[name]["keys"]), name
    for copy in (moved, back):  # every entry exactly: rows, optimizer state, scores
        for name in ("tw", "rw"):
            for field in ("keys", "values", "scores"):
                assert torch.equal(copy[name][field], trained[name][field]), (name, field)
    for rank in range(WORLD):  # and training goes on the same (Adam's step restored)
        first, second, third = results[rank][1]
        assert all(torch.equal(a, c) for a, c in zip(first, third)), rank
        # Plan B's row-wise tw table is larger: it evicts nothing, so only the first
        # step after the load is the same in both plans.
        assert torch.equal(first[0], second[0]), rank


def test_table_wise_sequence_table_beside_row_wise_equals_unsharded():
    """EmbeddingCollection: t1 whole on the last rank, t0 row-wise (shared by two
    features), with and without use_index_dedup."""
    cases = [
        SeqCase("ADAM", "hash_roundrobin", "NONE", table_wise=True),
        SeqCase("EXACT_ROWWISE_ADAGRAD", "roundrobin", "NONE", index_dedup=True, table_wise=True),
    ]
    batch_sizes = [3, 5]
    results = run_ranks(train_sharded, WORLD, cases, batch_sizes)
    for c, case in enumerate(cases):
        reference, ref_outputs = train_sequence_reference(case, batch_sizes, WORLD)
        for rank in range(WORLD):
            outputs, keys, rows = results[rank][c]
            a, b = sum(batch_sizes[:rank]), sum(batch_sizes[: rank + 1])
            for step in range(STEPS):
                want = sequence_slice(case, step, ref_outputs[step], batch_sizes, a, b)
                for got, wanted in zip(outputs[step], want, strict=True):
                    _close(got, wanted, f"{case} rank {rank} step {step}")
            assert ("t1" in rows) == (rank == WORLD - 1), (case, rank)
        keys = results[0][c][1]
        for t, name in enumerate(["t0", "t1"]):
            want_rows, want_found = reference.tables[t].find(keys)
            held = torch.zeros(keys.numel(), dtype=torch.int64)
            for rank in range(WORLD):
                if name in results[rank][c][2]:
                    values, found = results[rank][c][2][name]
                    held += found.long()
                    _close(values[found], want_rows[found], f"{case} {name} rows")
            assert torch.equal(held, want_found.long()), f"{case} {name}: keys lost or doubled"
