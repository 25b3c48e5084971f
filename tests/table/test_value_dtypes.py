"""float16 / bfloat16 row storage behaves like float32 up to the storage precision."""

import pytest
import torch

import dynemb


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_storage_round_trips(dtype):
    t32 = dynemb.ScoredHashTable(dim=8, capacity=4096, extra_columns=2)
    t16 = dynemb.ScoredHashTable(dim=8, capacity=4096, extra_columns=2, value_dtype=dtype)
    keys = torch.randint(-(2**63), 2**63 - 1, (1000,), generator=torch.Generator().manual_seed(0))
    a, b = t32.find_or_insert(keys), t16.find_or_insert(keys)
    assert b.dtype == dtype
    assert torch.allclose(a, b.float(), atol=1e-3, rtol=1e-2)
    values = torch.randn(1000, 10)
    t16.insert_or_assign(keys, values)
    got, found = t16.find(keys)
    assert bool(found.all())
    assert torch.equal(got, values[:, :8].to(dtype))
    k, v, _, _ = t16.export_batch(0, t16.capacity(), include_extra=True)
    order = torch.argsort(k)
    ref_order = torch.argsort(keys)
    assert torch.equal(v[order], values[ref_order].to(dtype))
