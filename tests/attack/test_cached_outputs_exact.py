"""A caching table's outputs equal the uncached table's bit for bit, also when a batch
holds more keys than the cache takes: the cached and the staged rows of a bag are pooled
in one sum, in index order (two partial sums added would round differently, by up to
2.4e-7 here)."""

import pytest
import torch

from dynemb import DynamicEmbPoolingMode as P
from tests.support.caching_models import batches, contents, module, options


def _train(m, batch, weights):
    ids, offsets = batch
    args = (ids, offsets) if not weights else (ids, offsets, torch.linspace(0.1, 2, ids.numel()))
    out = m(*args)
    (out * torch.linspace(-1, 1, out.shape[1])).sum().backward()
    return out.detach()


@pytest.mark.parametrize("pooling", [P.SUM, P.MEAN])
@pytest.mark.parametrize("weights", [False, True])
@pytest.mark.parametrize("cache_rows", [(16, 16), (64, 128)])  # smaller than a batch, larger
def test_pooled_outputs_and_tables_are_bit_identical(pooling, weights, cache_rows):
    plain = module([options(), options()], pooling=pooling)
    cached = module([options(n, state=1) for n in cache_rows], pooling=pooling)
    for batch in batches(6):
        want = _train(plain, batch, weights)
        got = _train(cached, batch, weights)
        assert torch.equal(got, want)
    if cache_rows == (16, 16):
        assert all(s.staged > 0 for s in cached.cache_stats())  # the case of the defect
    for t in range(2):
        want_rows = contents(plain.tables[t])
        got_rows = contents(cached.tables[t])
        assert set(got_rows) == set(want_rows)
        assert all(torch.equal(got_rows[k][0], want_rows[k][0]) for k in want_rows)


def test_sequence_rows_are_bit_identical_with_staging():
    plain = module([options(), options()], pooling=P.NONE)
    cached = module([options(16, state=1), options(16, state=1)], pooling=P.NONE)
    for batch in batches(4):
        assert torch.equal(_train(cached, batch, False), _train(plain, batch, False))
