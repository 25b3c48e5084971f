"""split_by_table: each table's share of a TBE batch, in a number of tensor ops that does
not grow with the number of tables, and private to the call (no alias of the caller's
tensors)."""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from dynemb.tbe.batch_layout import split_by_table

pytestmark = pytest.mark.no_emulated_pass("Python tensor ops only, no executor code")


def _batch(num_features, batch_size, seed=0):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, 4, (num_features * batch_size,), generator=g)
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])
    n = int(offsets[-1])
    return torch.randint(0, 1000, (n,), generator=g), offsets, torch.rand(n, generator=g)


def _reference(indices, offsets, weights, fmap, num_tables, B):
    """Table t's keys, rebased offsets and weights, feature by feature."""
    out = []
    for t in range(num_tables):
        features = [f for f, tt in enumerate(fmap) if tt == t]
        if not features:
            out.append(None)
            continue
        keys, offs, w = [], [0], []
        for f in features:
            a, b = int(offsets[f * B]), int(offsets[(f + 1) * B])
            keys += indices[a:b].tolist()
            w += weights[a:b].tolist()
            base = offs[-1]
            offs += [base + int(o) - a for o in offsets[f * B + 1 : (f + 1) * B + 1]]
        out.append((features, keys, offs, w))
    return out


@pytest.mark.parametrize("batch_size", [0, 1, 5])
def test_each_table_gets_its_features_keys_offsets_and_weights(batch_size):
    fmap = [2, 0, 2, 3, 0, 2]  # table 1 unused; tables 0 and 2 serve several features
    indices, offsets, weights = _batch(len(fmap), batch_size)
    got = split_by_table(indices, offsets, weights, fmap, 4, batch_size)
    for tb, ref in zip(got, _reference(indices, offsets, weights, fmap, 4, batch_size)):
        if ref is None:
            assert tb is None
            continue
        features, keys, offs, w = ref
        assert tb.features == features
        assert tb.keys.tolist() == keys and tb.keys.dtype == torch.int64
        assert tb.offsets.tolist() == offs and tb.offsets.is_contiguous()
        assert tb.weights.tolist() == w


def test_the_split_does_not_alias_the_callers_tensors():
    indices, offsets, weights = _batch(3, 4)
    tables = split_by_table(indices, offsets, weights, [0, 1, 2], 3, 4)
    keys = [tb.keys.clone() for tb in tables]
    offs = [tb.offsets.clone() for tb in tables]
    w = [tb.weights.clone() for tb in tables]
    indices.fill_(-7), offsets.fill_(0), weights.fill_(0.0)  # a reused input buffer
    for tb, k, o, ww in zip(tables, keys, offs, w):
        assert torch.equal(tb.keys, k) and torch.equal(tb.offsets, o)
        assert torch.equal(tb.weights, ww)


class _KernelOps(TorchDispatchMode):
    """Counts aten calls that compute (views and metadata ops excluded)."""

    VIEWS = {"slice", "select", "view", "alias", "unsqueeze", "_local_scalar_dense"}

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket.__name__ not in self.VIEWS:
            self.count += 1
        return func(*args, **(kwargs or {}))


def _ops_for(num_tables):
    indices, offsets, weights = _batch(num_tables, 16, seed=num_tables)
    with _KernelOps() as ops:
        split_by_table(indices, offsets, weights, list(range(num_tables)), num_tables, 16)
    return ops.count


def test_tensor_ops_do_not_grow_with_the_number_of_tables():
    assert _ops_for(4) == _ops_for(64)
