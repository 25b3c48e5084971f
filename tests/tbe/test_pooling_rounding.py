"""The pooled forward rounds as fbgemm's CPU TBE (what TorchRec's sharded static tables
run): the same bits for SUM, MEAN, weighted SUM and weighted MEAN, at dims with the CPU
executor's register kernel (8, 16) and without (4, 12), over empty, short and long bags
(core/pooling.h: a fused multiply-add per term, in index order, from +0; MEAN multiplies
by 1.0f / length). The unsharded TorchRec module (nn.EmbeddingBag) rounds SUM and
weighted SUM the same; its MEAN divides, within one ulp (tests/warm_start/
test_static_to_dynamic.py)."""

import pytest
import torch

from dynemb import BatchedDynamicEmbeddingTables, DynamicEmbPoolingMode, DynamicEmbTableOptions
from tests.support import fbgemm_reference as fb

ROWS = 64
BAGS = 300


@pytest.mark.parametrize("dims", [[8, 16], [4, 12]])
@pytest.mark.parametrize("pooling", ["sum", "mean"])
@pytest.mark.parametrize("weighted", [False, True])
def test_pooled_outputs_equal_fbgemm_bit_for_bit(dims, pooling, weighted, device):
    g = torch.Generator().manual_seed(7)
    tbe = fb.make_fbgemm_tbe([ROWS] * len(dims), dims, None, "sgd", pooling, 0.1, 1e-8)
    ours = BatchedDynamicEmbeddingTables(
        [DynamicEmbTableOptions(dim=d, max_capacity=4 * ROWS, bucket_capacity=16) for d in dims],
        feature_table_map=list(range(len(dims))),
        pooling_mode=DynamicEmbPoolingMode[pooling.upper()],
        device=device,
    )
    for t, d in enumerate(dims):
        scale = 2.0 ** torch.randint(-8, 8, (ROWS, 1), generator=g)  # rows of many magnitudes
        rows = torch.randn(ROWS, d, generator=g) * scale
        fb.set_rows(tbe, t, rows)
        ours.tables[t].insert_or_assign(torch.arange(ROWS, device=device), rows.to(device))
    lengths = torch.randint(0, 9, (len(dims) * BAGS,), generator=g)
    lengths[::50] = 40  # long bags: many roundings in a row
    lengths[1::50] = 0
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])
    indices = torch.randint(0, ROWS, (int(offsets[-1]),), generator=g)
    weights = torch.randn(indices.numel(), generator=g) if weighted else None
    want = tbe(indices, offsets, per_sample_weights=weights).detach()
    ours.eval()  # every key stored: the same rows as training reads, nothing inserted
    on = [None if x is None else x.to(device) for x in (indices, offsets, weights)]
    got = ours(*on).detach().cpu()
    assert torch.equal(got, want), f"max difference {(got - want).abs().max().item()}"
