"""One model with dynamic tables under every sharding type (table-wise, column-wise,
row-wise, and table-row-wise for pooled tables: TorchRec has none for sequence ones)
beside an ordinary TorchRec table, on 2 ranks (one node) and 4 ranks (two nodes of 2),
pooled SUM and MEAN (EmbeddingBagCollection) and sequence (EmbeddingCollection), under
EXACT_ROWWISE_ADAGRAD, ADAM and EXACT_SGD, over 10 steps with evictions: outputs, and
every table's keys, rows, optimizer state and scores, equal the unsharded tables'."""

import pytest
import torch

from tests.support.mixed_sharding_workers import (
    BATCH,
    DIM,
    LOCAL,
    ORDINARY,
    SMALL,
    STEPS,
    Case,
    global_batch,
    train_mixed,
    train_reference,
)
from tests.support.multiprocess import run_ranks

pytestmark = pytest.mark.no_emulated_pass(
    "TorchRec's sharding plumbing on gloo ranks: the table ops are the emulated pass's elsewhere"
)

ATOL = 1e-6
CASES = [
    Case(optimizer, pooling)
    for optimizer in ("EXACT_SGD", "EXACT_ROWWISE_ADAGRAD", "ADAM")
    for pooling in ("SUM", "MEAN", "NONE")
]


def _close(got, want, what: str, rtol: float = 0.0) -> None:
    torch.testing.assert_close(got, want, atol=ATOL, rtol=rtol, msg=lambda m: f"{what}: {m}")


def _rank_rows(case: Case, lengths, f: int, rank: int) -> slice:
    if case.pooling != "NONE":
        return slice(rank * BATCH, (rank + 1) * BATCH)
    return slice(int(lengths[f, : rank * BATCH].sum()), int(lengths[f, : (rank + 1) * BATCH].sum()))


def _check_tables(case: Case, world: int, results: list, tables: dict) -> None:
    """Every rank's dynamic tables equal their unsharded references."""
    want = {name: t.tables[0] for name, t in tables.items()}
    # Row-wise and table-row-wise MEAN: TorchRec divides by (length + 1e-6), so their
    # gradients (and optimizer state) differ from the unsharded table's by ~1e-6.
    rtol = 2e-6 if case.pooling == "MEAN" else 0.0
    local = min(LOCAL, world)
    holders = {"rw": range(world), "twrw": range(world - local, world)}  # the last node
    for name in (n for n in holders if n in case.tables()):
        for r in range(world):
            assert (name in results[r][1]) == (r in holders[name]), (case, name, r)
        shares = [results[r][1][name] for r in holders[name]]
        order = torch.argsort(torch.cat([e["keys"] for e in shares]))
        for field in ("keys", "values", "scores"):
            got = torch.cat([e[field] for e in shares])[order]
            _close(got, _entries(want[name])[field], f"{case} {name} {field}", rtol)
    tw_rank = world - 1
    for r in range(world):
        assert ("tw" in results[r][1]) == (r == tw_rank), (case, r)  # whole, on one rank
        cw = results[r][1]["cw"]
        assert torch.equal(cw["keys"], results[0][1]["cw"]["keys"]), (case, r)  # slices agree
        assert cw["keys"].numel() == SMALL, f"{case}: the column-wise table must evict"
        for field in ("keys", "values", "scores"):
            _close(cw[field], _entries(want[f"cw{r}"])[field], f"{case} cw slice {r} {field}")
    tw = results[tw_rank][1]["tw"]
    assert tw["keys"].numel() == SMALL, f"{case}: the table-wise table must evict"
    for field in ("keys", "values", "scores"):
        _close(tw[field], _entries(want["tw"])[field], f"{case} tw {field}")
    if ORDINARY in case.tables():
        assert all(results[r][2] is None for r in range(1, world))
        rows = _entries(want[ORDINARY])["values"][:, :DIM]
        _close(results[0][2], rows, f"{case} ordinary rows")


def _entries(table) -> dict:
    keys, values, scores, _ = table.export_batch(0, max(1, table.capacity()), include_extra=True)
    order = torch.argsort(keys)
    return {"keys": keys[order], "values": values[order], "scores": scores[order]}


@pytest.mark.parametrize("world", [2, 4])
def test_every_sharding_type_in_one_model_equals_unsharded(world, tmp_path):
    refused_dir = tmp_path / "dynamicemb_layout"
    results = run_ranks(train_mixed, world, CASES, str(refused_dir), timeout=300.0)
    for c, case in enumerate(CASES):
        # DynamicEmb's layout holds whole rows of tables on every rank: every rank names
        # every other table, whatever its sharding type, and nothing is written (a
        # table-row-wise table on one node of ranks is on every rank).
        partial = sorted({"tw", "twrw"} & set(case.tables())) if world > LOCAL else ["tw"]
        for r in results:
            assert "tables ['cw'] are sharded column-wise" in r[c][3], r[c][3]
            assert f"tables {partial} are sharded table-wise or table-row-wise" in r[c][3]
        assert not refused_dir.exists() or not any(refused_dir.iterdir())
        tables, want_outputs = train_reference(case, world)
        for step in range(STEPS):
            lengths, _ = global_batch(step, BATCH * world, case)
            for f, name in enumerate(case.tables()):
                for rank in range(world):
                    got = results[rank][c][0][step][f]
                    want = want_outputs[step][f][_rank_rows(case, lengths, f, rank)]
                    _close(got, want, f"{case} rank {rank} step {step} table {name}")
        _check_tables(case, world, [r[c] for r in results], tables)
