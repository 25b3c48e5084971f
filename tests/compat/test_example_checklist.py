"""DYNAMICEMB_API.md §12 end to end on 2 gloo ranks: DynamicEmb's example.py calls (EC, Adam,
admission on tiny tables, caching, dump -> load, get_score -> incremental_dump), and the
structures its users read."""

import pytest
import torch

from tests.support.example_checklist_workers import DIM, ROWS, run_checklist
from tests.support.multiprocess import run_ranks

pytestmark = pytest.mark.no_emulated_pass(
    "DynamicEmb's example calls over spawned gloo ranks: the API's structure; their table ops are tested per executor elsewhere"
)

TABLES = {f"t{i}" for i in range(len(ROWS))}


def test_example_checklist_on_two_ranks(tmp_path):
    results = run_ranks(run_checklist, 2, str(tmp_path), timeout=150)
    for r in results:
        for name in TABLES:  # dump -> load gives back every row exactly
            (k1, v1), (k2, v2) = r["saved"][name], r["loaded"][name]
            assert torch.equal(k1, k2) and torch.equal(v1, v2), name
        # get_score: {"model": {table: int}}, STEP scores
        for scores in (r["scores"], r["new_scores"]):
            assert set(scores) == {"model"} and set(scores["model"]) == TABLES
            assert all(isinstance(v, int) for v in scores["model"].values())
        assert all(r["new_scores"]["model"][t] > r["scores"]["model"][t] for t in TABLES)
        # incremental_dump: {"model": {table: (keys int64 [N], values [N, dim] float32)}}
        assert set(r["dumped"]) == {"model"} and set(r["dumped"]["model"]) == TABLES
        for keys, values in r["dumped"]["model"].values():
            assert keys.dtype == torch.int64 and keys.dim() == 1 and keys.device.type == "cpu"
            assert values.dtype == torch.float32 and values.shape == (keys.size(0), DIM)
        assert r["dumped"]["model"]["t5"][0].size(0) > 0  # rows touched after the scores
    # admission on the 2-row table: only keys seen twice are stored, at most 2 of them
    stored = sum(r["saved"]["t0"][0].numel() for r in results)
    assert 0 < stored <= ROWS[0]
