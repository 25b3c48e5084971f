"""Probabilistic admission and eviction by rule through the sharders, on 2 gloo ranks:
a table sharded column-wise keeps one set of keys in every slice (the slices draw the
same admission coin and erase by the same step), beside a row-wise one; erase_stale over
the model erases in every shard."""

import pytest
import torch

from tests.support.multiprocess import run_ranks
from tests.support.rules_sharded_workers import train_with_rules

pytestmark = pytest.mark.no_emulated_pass(
    "TorchRec's sharded plumbing on gloo ranks: the rules' table ops are the emulated pass's elsewhere"
)


def test_column_slices_admit_and_erase_the_same_keys():
    ranks = run_ranks(train_with_rules, 2)
    (trained0, counts0, after0), (trained1, counts1, after1) = ranks
    for a, b in ((trained0, trained1), (after0, after1)):
        assert torch.equal(a["cw"]["keys"], b["cw"]["keys"])  # one key set in both slices
        assert torch.equal(a["cw"]["scores"], b["cw"]["scores"])
    assert trained0["cw"]["keys"].numel() > 0 and trained0["rw"]["keys"].numel() > 0
    (path,) = counts0
    assert counts0[path]["cw"] == counts1[path]["cw"] > 0
    for after in (after0, after1):  # nothing idle for more than 1 step is left
        for name in ("cw", "rw"):
            scores = after[name]["scores"]
            assert scores.numel() == 0 or int(scores.min()) >= int(scores.max()) - 1
