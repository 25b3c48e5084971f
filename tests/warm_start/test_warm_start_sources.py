"""Each kind of source and each table-side path: a user Storage, a caching table (its
built-in slow tier and an external one: a key missing from both tiers reads the
source, once), admission (a key not admitted reads nothing), the mappings of a
weight (ids, modulo, a function) and column slices."""

import pytest
import torch

from dynemb import FrequencyAdmissionStrategy, KVCounter
from dynemb.tiering import StorageSpec
from dynemb.types import DynamicEmbScoreStrategy
from dynemb.warm_start import WarmStart
from tests.support.caching_models import DictStorage
from tests.support.counting import CountingSource
from tests.support.static_models import batch, dynamic_twin, static_model, train_static


def _dict_storage(dim: int, rows: dict) -> DictStorage:
    spec = StorageSpec(dim, 0, torch.float32, 1024, DynamicEmbScoreStrategy.TIMESTAMP, 16,
                       torch.device("cpu"))  # fmt: skip
    storage = DictStorage(spec)
    for key, row in rows.items():
        storage.rows[key] = (row, 0)
    return storage


def test_storage_source_rows_or_the_initializer(device):
    rows = {k: torch.randn(8) for k in (3, 9, -5, 2**50)}
    source = CountingSource(WarmStart.from_storage(_dict_storage(8, rows), dim=8))
    warm, plain = dynamic_twin({"t0": source}, device), dynamic_twin({}, device)
    keys = torch.tensor([3, 4, -5, 2**50, 11], device=device)
    got, want = warm.tables[0].find_or_insert(keys), plain.tables[0].find_or_insert(keys)
    for i, k in enumerate(keys.tolist()):
        assert torch.equal(got[i].cpu(), rows[k] if k in rows else want[i].cpu()), k
    assert source.asked == [sorted(keys.tolist())]


@pytest.mark.parametrize("external", [False, True])
def test_caching_table_reads_the_source_once_per_key_new_to_both_tiers(external, device):
    g = torch.Generator().manual_seed(5)
    static = static_model()
    train_static(static, 2, g)
    state = static.state_dict()
    sources = {n: CountingSource(WarmStart.from_state_dict(state, n)) for n in ("t0", "t1")}
    storage = {"external_storage": DictStorage} if external else {}
    cached = dynamic_twin(sources, device, caching=True, local_hbm_for_values=16 * 8 * 4,
                          **storage)  # fmt: skip
    uncached = dynamic_twin({n: WarmStart.from_state_dict(state, n) for n in ("t0", "t1")}, device)
    for step in range(6):
        kjt, indices, offsets = batch(g)
        want = static(kjt).values().detach()
        got = cached(indices.to(device), offsets.to(device))
        if step == 0:
            assert torch.equal(got.detach().cpu(), want)
        torch.testing.assert_close(got, uncached(indices.to(device), offsets.to(device)),
                                   atol=1e-6, rtol=0)  # fmt: skip
        grad = torch.randn(got.shape, generator=g).to(device)
        got.backward(grad)
        uncached(indices.to(device), offsets.to(device)).backward(grad)
    assert cached.tables[0].cache_stats.written_back > 0  # keys left the cache and came back
    for source in sources.values():
        asked = source.keys_asked()
        assert asked and len(asked) == len(set(asked))  # each key once, the first time


def test_a_key_not_admitted_reads_nothing(device):
    weight = torch.randn(100, 8)
    source = CountingSource(WarmStart.from_tensor(weight))
    module = dynamic_twin({"t0": source}, device,
                          admit_strategy=FrequencyAdmissionStrategy(2, counter=KVCounter(capacity=1024, bucket_capacity=128)),)  # fmt: skip
    g = torch.Generator().manual_seed(9)
    for step in range(4):
        _, indices, offsets = batch(g, high={"t0": 100, "t1": 30})
        reads = len(source.asked)
        out = module(indices.to(device), offsets.to(device))
        if step < 3:  # the last batch's rows stay as inserted
            out.sum().backward()
    table = module.tables[0]
    asked = source.keys_asked()
    assert asked and len(asked) == len(set(asked))
    stored = table.contains(torch.arange(100, device=device)).cpu()
    assert set(asked) == set(torch.nonzero(stored).flatten().tolist())  # admitted = asked
    rows, found = table.find(torch.tensor(asked, device=device))
    assert bool(found.all())
    assert len(source.asked) == reads + 1  # the last batch admitted keys
    last = torch.tensor(source.asked[-1], device=device)
    assert torch.equal(table.find(last)[0].cpu(), weight[last.cpu()])


def test_weight_mappings_and_column_slices():
    weight = torch.randn(10, 6)
    keys = torch.tensor([-3, 0, 9, 10, 23, 2**62])
    identity = WarmStart.from_tensor(weight).rows(keys)
    assert identity.found.tolist() == [False, True, True, False, False, False]
    assert torch.equal(identity.values[1:3], weight[[0, 9]])
    modulo = WarmStart.from_tensor(weight, ids="modulo").rows(keys)
    assert bool(modulo.found.all())
    assert torch.equal(modulo.values, weight[torch.remainder(keys, 10)])
    ids = torch.tensor([100, -7, 5, 2**62, 1, 2, 3, 4, 6, 8])
    keyed = WarmStart.from_tensor(weight, ids=ids).rows(keys)
    assert keyed.found.tolist() == [False, False, False, False, False, True]
    assert torch.equal(keyed.values[5], weight[3])
    hashed = WarmStart.from_tensor(weight, ids=lambda k: torch.where(k > 0, k % 7, -1)).rows(keys)
    assert hashed.found.tolist() == [False, False, True, True, True, True]
    assert torch.equal(hashed.values[2:], weight[keys[2:] % 7])
    part = WarmStart.from_tensor(weight, ids="modulo").columns(2, 3).rows(keys)
    assert part.state is None and torch.equal(part.values, modulo.values[:, 2:5])
