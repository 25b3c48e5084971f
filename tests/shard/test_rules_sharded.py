"""Probabilistic admission and eviction by rule through the sharders, on 2 gloo ranks:
a table sharded column-wise keeps one set of keys in every slice (the slices draw the
same admission coin and erase by the same step), beside a row-wise one; erase_stale over
the model erases in every shard; a table-wise and a table-row-wise table do the same."""

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


def _nothing_idle(after):
    for name, entries in after.items():
        scores = entries["scores"]
        assert scores.numel() == 0 or int(scores.min()) >= int(scores.max()) - 1, name


def test_table_wise_and_table_row_wise_tables_admit_and_erase():
    ranks = run_ranks(train_with_rules, 2, "tw+twrw")
    (trained0, counts0, after0), (trained1, counts1, after1) = ranks
    assert "cw" not in trained0 and trained1["cw"]["keys"].numel() > 0  # whole on rank 1
    assert all(t["rw"]["keys"].numel() > 0 for t in (trained0, trained1))  # rows on both
    erased = {"cw": 0, "rw": 0}
    for counts in (counts0, counts1):
        for tables in counts.values():
            for name, n in tables.items():
                erased[name] += n
    assert erased["cw"] > 0 and erased["rw"] > 0, erased
    for after in (after0, after1):
        _nothing_idle(after)
    # the key sets shrank by what each rank reported
    for trained, after, counts in ((trained0, after0, counts0), (trained1, after1, counts1)):
        for name in after:
            n = sum(tables.get(name, 0) for tables in counts.values())
            assert after[name]["keys"].numel() == trained[name]["keys"].numel() - n, name
