"""Warm start under sharding, on 2 real gloo ranks: row-wise (each rank reads only the
keys it owns) and column-wise (each slice reads its columns) outputs equal the static
model's; the planner's broadcast keeps each rank's own source; a checkpoint dumped on
2 ranks warm-starts a table on 1 with its optimizer state, and one dumped on 1 warm-
starts the 2-rank model."""

import pytest
import torch

from dynemb import (
    BatchedDynamicEmbeddingTables,
    DynamicEmbDump,
    DynamicEmbPoolingMode,
    DynamicEmbTableOptions,
)
from dynemb.warm_start import WarmStart
from tests.support.multiprocess import run_ranks
from tests.support.warm_start_workers import (
    BATCH,
    DIMS,
    FEATURES,
    OPTIMIZER,
    ROWS,
    global_batch,
    kjt,
    static_model,
    static_weights,
    warm_sharded,
)

pytestmark = pytest.mark.no_emulated_pass(
    "TorchRec's sharding plumbing on gloo ranks: the warm-start path is the emulated pass's in "
    "the unsharded tests"
)

WORLD = 2


def _single_table(source) -> BatchedDynamicEmbeddingTables:
    return BatchedDynamicEmbeddingTables(
        [DynamicEmbTableOptions(dim=DIMS["rw"], max_capacity=256, bucket_capacity=16,
                                warm_start=source)],
        feature_table_map=[0], pooling_mode=DynamicEmbPoolingMode.SUM, optimizer=OPTIMIZER,
        learning_rate=0.1, eps=1e-3, table_names=["rw"],
    )  # fmt: skip


def _check_outputs_and_reads(ranks: list, weights: dict) -> None:
    lengths, keys = global_batch(BATCH * WORLD)
    want = static_model(weights)(kjt(lengths, keys, 0, BATCH * WORLD)).values().detach()
    per_feature = kjt(lengths, keys, 0, BATCH * WORLD).to_dict()
    for rank, r in enumerate(ranks):
        rows = slice(rank * BATCH, (rank + 1) * BATCH)
        torch.testing.assert_close(r["out"], want[rows], atol=1e-6, rtol=0)
        assert r["planned"]  # the planner's plan carries this rank's own source
        # Column-wise: every slice stores every key, reading its columns once.
        assert r["asked"]["cw"] == sorted(set(per_feature[FEATURES[1]].values().tolist()))
    rw_keys = sorted(set(per_feature[FEATURES[0]].values().tolist()))
    asked = [r["asked"]["rw"] for r in ranks]
    assert sorted(asked[0] + asked[1]) == rw_keys and asked[0] and asked[1]  # disjoint shares
    for r in ranks:  # each rank read exactly the keys it stores
        assert r["asked"]["rw"] == r["rw"]["keys"].tolist()


def test_sharded_warm_start_and_a_dump_from_two_ranks_into_one(tmp_path):
    dump = tmp_path / "two_ranks"
    ranks = run_ranks(warm_sharded, WORLD, None, str(dump), timeout=120)
    _check_outputs_and_reads(ranks, static_weights())
    keys = torch.cat([r["trained"]["keys"] for r in ranks])
    rows = torch.cat([r["trained"]["values"] for r in ranks])
    assert bool((rows[:, DIMS["rw"] :] != 0).all())  # trained: optimizer state to carry
    one = _single_table(WarmStart.from_dump(dump, "rw"))
    slots, _ = one.tables[0].find_or_insert_slots(keys)
    got = one.tables[0].find_entries(keys)[0]
    assert bool((slots >= 0).all()) and torch.equal(got, rows)  # rows and state, exactly


def test_a_dump_from_one_rank_warm_starts_two(tmp_path):
    weights = static_weights()
    trained = _single_table(None)
    keys = torch.arange(ROWS)
    state = torch.rand(ROWS, 1) + 0.5
    trained.tables[0].insert_or_assign(keys, torch.cat([weights["rw"] * 2, state], dim=1))
    DynamicEmbDump(tmp_path / "one_rank", trained, optim=True)
    ranks = run_ranks(warm_sharded, WORLD, str(tmp_path / "one_rank"), None, timeout=120)
    _check_outputs_and_reads(ranks, {**weights, "rw": weights["rw"] * 2})
    for r in ranks:  # rows and optimizer state as dumped
        got = r["rw"]
        assert torch.equal(got["values"][:, : DIMS["rw"]], weights["rw"][got["keys"]] * 2)
        assert torch.equal(got["values"][:, DIMS["rw"] :], state[got["keys"]])
