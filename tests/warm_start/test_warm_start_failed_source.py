"""A warm-start source that fails for a batch (an ids function that raises, or returns
rows of the wrong shape) leaves the table as it was: the error propagates, no key of
the batch is stored, and a later lookup of those keys reads the source again."""

import pytest
import torch

from dynemb import ScoredHashTable
from dynemb.warm_start import TableFill, WarmStart
from tests.support.flaky_sources import WEIGHT, Flaky
from tests.support.static_models import batch, dynamic_twin

ERRORS = {"raises": (KeyError, "source offline"), "shape": (ValueError, r"must return \(")}


@pytest.mark.parametrize("how", list(ERRORS))
@pytest.mark.parametrize("init_capacity", [16, 64])  # growth during the batch / no growth
def test_a_failed_source_stores_nothing_and_is_read_again(how, init_capacity, device):
    ids = Flaky(how)
    table = ScoredHashTable(dim=4, capacity=64, init_capacity=init_capacity,
                            bucket_capacity=16, device=device)  # fmt: skip
    table.warm_start = TableFill(WarmStart.from_tensor(WEIGHT, ids), 4, 0, torch.float32, "t")
    old = torch.arange(10, device=device)
    table.find_or_insert(old)
    before = table.find_entries(old)
    size, capacity, step = table.size(), table.capacity(), table.score_step
    keys = torch.arange(5, 40, device=device)  # 5 stored, 30 new (more than 16 slots)
    ids.fail = True
    error, match = ERRORS[how]
    with pytest.raises(error, match=match):
        table.find_or_insert_slots(keys)
    assert table.size() == size and table.score_step == step
    assert not bool(table.contains(keys[5:]).any())
    after = table.find_entries(old)
    for a, b in zip(after, before):
        assert torch.equal(a, b)
    assert table.capacity() >= capacity  # a table that grew keeps its larger capacity
    ids.fail = False
    calls = ids.calls
    rows = table.find_or_insert(keys)
    assert ids.calls == calls + 1  # the new keys read the source again
    assert torch.equal(rows.cpu(), WEIGHT[keys.cpu()])


@pytest.mark.parametrize("how", list(ERRORS))
def test_a_failed_source_fails_the_forward_and_the_next_one_reads_it(how, device):
    ids = Flaky(how)
    module = dynamic_twin({"t0": WarmStart.from_tensor(WEIGHT[:, :4].repeat(1, 2), ids)}, device)
    g = torch.Generator().manual_seed(4)
    _, indices, offsets = batch(g)
    table = module.tables[0]
    ids.fail = True
    error, match = ERRORS[how]
    with pytest.raises(error, match=match):
        module(indices.to(device), offsets.to(device))
    assert table.size() == 0
    ids.fail = False
    module(indices.to(device), offsets.to(device)).sum().backward()
    keys = torch.unique(indices[offsets[0] : offsets[6]]).to(device)
    assert table.size() == keys.numel()
    assert ids.calls == 2  # the failed read, then the one that stored the keys
