"""Dynamic tables sharded table-row-wise, on 4 gloo ranks (two nodes of 2; one node of
2 is in test_mixed_sharding.py), pooled SUM and MEAN, under EXACT_ROWWISE_ADAGRAD, ADAM
and EXACT_SGD, over 10 steps with evictions: outputs, and every table's keys, rows,
optimizer state and scores, equal the unsharded references'; keys are stored only on the
ranks of their table's node, each on the rank its routing names."""

import pytest
import torch

from dynemb.distributed.routing import route_keys
from tests.support.multiprocess import run_ranks
from tests.support.table_row_wise_workers import (
    BATCH,
    DIST_TYPES,
    ROWS,
    SMALL,
    STEPS,
    Case,
    checkpoint_round_trip,
    entries,
    ordinary_beside_dynamic,
    planned_placement,
    table_node,
    train_reference,
    train_twrw,
)

pytestmark = pytest.mark.no_emulated_pass(
    "TorchRec's sharding plumbing on gloo ranks: the table ops are the emulated pass's elsewhere"
)

ATOL = 1e-6
LOCAL_SIZE = 2
CASES = [
    Case(optimizer, pooling)
    for optimizer in ("EXACT_SGD", "EXACT_ROWWISE_ADAGRAD", "ADAM", "FTRL")
    for pooling in ("SUM", "MEAN")
]


def _close(got, want, what: str, rtol: float = 0.0) -> None:
    torch.testing.assert_close(got, want, atol=ATOL, rtol=rtol, msg=lambda m: f"{what}: {m}")


def _check_placement(name: str, world: int, results: list) -> None:
    """Keys of ``name`` only on its node's ranks, each on the rank its routing names."""
    node = table_node(name, world, LOCAL_SIZE)
    for rank in range(world):
        held = results[rank][1]
        if rank // LOCAL_SIZE != node:
            assert name not in held, f"{name} stored on rank {rank}, outside node {node}"
            continue
        keys = held[name]["keys"]
        owner, _ = route_keys(keys, DIST_TYPES[name], LOCAL_SIZE, ROWS)
        assert torch.equal(owner, torch.full_like(owner, rank % LOCAL_SIZE)), (name, rank)


def _check_tables(case: Case, world: int, results: list, tables: dict) -> None:
    node_ranks = {
        name: [r for r in range(world) if r // LOCAL_SIZE == table_node(name, world, LOCAL_SIZE)]
        for name in ("near", "far")
    }
    # MEAN: TorchRec divides by (length + 1e-6) after the output dist, so gradients
    # (and the optimizer state) differ from an exact mean's by ~1e-6, relatively.
    rtol = 2e-6 if case.pooling == "MEAN" else 0.0
    near = [results[r][1]["near"] for r in node_ranks["near"]]
    keys = torch.cat([e["keys"] for e in near])
    order = torch.argsort(keys)
    want = entries(tables["near"].tables[0])
    for field in ("keys", "values", "scores"):
        got = torch.cat([e[field] for e in near])[order]
        _close(got, want[field], f"{case} near {field}", rtol)
    for local, rank in enumerate(node_ranks["far"]):
        got = results[rank][1]["far"]
        assert got["keys"].numel() == SMALL, f"{case}: far's shard on rank {rank} must evict"
        want = entries(tables[f"far{local}"].tables[0])
        for field in ("keys", "values", "scores"):
            _close(got[field], want[field], f"{case} far shard {local} {field}", rtol)


# One node of 2 ranks (table-row-wise as row-wise, through TorchRec's TWRW dists) is
# tests/shard/test_mixed_sharding.py's world of 2, with the same optimizers and poolings.
@pytest.mark.parametrize(
    "batch_sizes",
    [[BATCH] * 4, [3, 5, 2, 4]],
    ids=["two_nodes", "two_nodes_uneven_batches"],
)
def test_table_row_wise_equals_unsharded(batch_sizes):
    world = len(batch_sizes)
    results = run_ranks(train_twrw, world, LOCAL_SIZE, CASES, batch_sizes, timeout=300.0)
    starts = [sum(batch_sizes[:r]) for r in range(world + 1)]
    for c, case in enumerate(CASES):
        tables, want_outputs = train_reference(case, batch_sizes, LOCAL_SIZE)
        rtol = 2e-6 if case.pooling == "MEAN" else 0.0
        for step in range(STEPS):
            for f, name in enumerate(("near", "far")):
                for rank in range(world):
                    got = results[rank][c][0][step][f]
                    want = want_outputs[step][f][starts[rank] : starts[rank + 1]]
                    _close(got, want, f"{case} rank {rank} step {step} {name}", rtol)
        rank_results = [r[c] for r in results]
        for name in ("near", "far"):
            _check_placement(name, world, rank_results)
        _check_tables(case, world, rank_results, tables)


@pytest.mark.parametrize("world", [2, 4])
def test_checkpoint_round_trip_within_the_plan(world, tmp_path):
    case = Case("ADAM", "SUM")
    results = run_ranks(checkpoint_round_trip, world, LOCAL_SIZE, case, str(tmp_path))
    for rank in range(world):
        (trained, loaded), (first, second) = results[rank]
        assert sorted(loaded) == sorted(trained), rank  # the same tables on the same ranks
        for name in trained:  # every entry exactly: rows, optimizer state, scores
            for field in ("keys", "values", "scores"):
                assert torch.equal(loaded[name][field], trained[name][field]), (rank, name, field)
        # and training goes on the same (Adam's step restored)
        for a, b in zip(first, second, strict=True):
            assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True)), rank


def test_planner_constrained_to_table_row_wise_plans_a_working_model():
    world = 4
    results = run_ranks(planned_placement, world, LOCAL_SIZE, Case("EXACT_SGD", "SUM"))
    types, ranks, _ = results[0]
    assert all(result[:2] == (types, ranks) for result in results)  # one plan everywhere
    for name in ("near", "far"):
        assert types[name] == "table_row_wise", name
        assert ranks[name] in ([0, 1], [2, 3]), (name, ranks[name])
        stored = 0
        for rank in range(world):
            keys = results[rank][2].get(name)
            if rank not in ranks[name]:
                assert keys is None, (name, rank)  # nothing of it outside its node
                continue
            owner, _ = route_keys(keys, DIST_TYPES[name], LOCAL_SIZE, ROWS)
            assert torch.equal(owner, torch.full_like(owner, ranks[name].index(rank)))
            stored += keys.numel()
        assert stored > 0, name


def test_ordinary_table_beside_dynamic_ones_keeps_torchrec_blocks():
    world = 4
    results = run_ranks(ordinary_beside_dynamic, world, LOCAL_SIZE)
    for rank, (got, want, _) in enumerate(results):
        _close(got, want, f"rank {rank} ordinary output")
    # TorchRec's blocks of ceil(41 / 2) rows on the last node's ranks, none elsewhere.
    assert [r[2] for r in results] == [[], [], [21], [20]]
