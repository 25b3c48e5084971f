"""In caching mode a warm-start source that fails leaves the table as it was, as an
uncached table's (test_warm_start_failed_source.py): the cache reads the source for the
keys new to both tiers before it claims any slot (a prefetch before its batch is
numbered), so no key of the batch is cached and no resident is evicted."""

import pytest
import torch

from dynemb.warm_start import WarmStart
from tests.support.caching_models import DictStorage
from tests.support.flaky_sources import WEIGHT, Flaky
from tests.support.static_models import batch, dynamic_twin


@pytest.mark.parametrize("external", [False, True])
def test_a_failed_source_leaves_a_cached_table_as_it_was(external, device):
    ids = Flaky("raises")
    storage = {"external_storage": DictStorage} if external else {}
    module = dynamic_twin({"t0": WarmStart.from_tensor(WEIGHT[:, :4].repeat(1, 2), ids)}, device,
                          caching=True, local_hbm_for_values=16 * 8 * 4, **storage)  # fmt: skip
    g = torch.Generator().manual_seed(4)
    for _ in range(4):
        _, indices, offsets = batch(g, high={"t0": 200, "t1": 30})
        module(indices.to(device), offsets.to(device)).sum().backward()
    table, every_key = module.tables[0], torch.arange(200, device=device)
    before = table.find(every_key)
    _, indices, offsets = batch(g, high={"t0": 200, "t1": 30})
    ids.fail = True
    with pytest.raises(KeyError, match="source offline"):
        module(indices.to(device), offsets.to(device))
    after = table.find(every_key)
    assert torch.equal(after[1], before[1])  # no key stored, none lost
    assert torch.equal(after[0], before[0])  # no row changed
    ids.fail = False  # the batch's new keys read the source again, and take its rows
    module(indices.to(device), offsets.to(device)).sum().backward()
    assert not torch.equal(table.find(every_key)[1], before[1])


@pytest.mark.parametrize("how", ["raises", "shape"])
def test_a_failed_prefetch_changes_nothing(how, device):
    """A prefetch whose source fails neither fills the cache nor numbers a batch: the
    next forward looks its keys up as if the prefetch had not run."""
    ids = Flaky(how)
    module = dynamic_twin({"t0": WarmStart.from_tensor(WEIGHT[:, :4].repeat(1, 2), ids)}, device,
                          caching=True, local_hbm_for_values=16 * 8 * 4)  # fmt: skip
    g = torch.Generator().manual_seed(6)
    for _ in range(3):
        _, indices, offsets = batch(g, high={"t0": 200, "t1": 30})
        module(indices.to(device), offsets.to(device)).sum().backward()
    table, every_key = module.tables[0], torch.arange(200, device=device)
    before, stats = table.find(every_key), table.cache_stats.prefetch_keys
    _, indices, offsets = batch(g, high={"t0": 200, "t1": 30})
    ids.fail = True
    with pytest.raises((KeyError, ValueError)):
        module.prefetch(indices.to(device), offsets.to(device))
    assert table.upcoming_batch() is None and table.batches_in_flight() == 0
    assert table.cache_stats.prefetch_keys == stats
    after = table.find(every_key)
    assert torch.equal(after[1], before[1]) and torch.equal(after[0], before[0])
    ids.fail = False
    module(indices.to(device), offsets.to(device)).sum().backward()
    assert table.batches_in_flight() == 0
