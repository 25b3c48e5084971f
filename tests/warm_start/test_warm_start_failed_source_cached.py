"""Known gap (DynamicEmb_APIs.md, "Warm start"): in caching mode the source is read
after the cache claimed the batch's slots, so a source that fails leaves keys of the
batch cached (and, with an external storage, may lose the latest rows of residents
the batch evicted). The test states the wanted behaviour, that of an uncached table
(test_warm_start_failed_source.py), and is expected to fail until the cache reads the
source before its claim or undoes it."""

import pytest
import torch

from dynemb.warm_start import WarmStart
from tests.tiering.caching_models import DictStorage
from tests.warm_start.static_models import batch, dynamic_twin
from tests.warm_start.test_warm_start_failed_source import WEIGHT, Flaky


@pytest.mark.xfail(strict=True, reason="caching mode reads the source after its claim")
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
