"""The issue's test: a TorchRec model trained some steps on static tables, converted to
dynamic tables that warm-start from its state dict, gives the static model's outputs on
its first batch, and trains on as the static model does.

First batch: SUM and weighted SUM bit for bit. MEAN bit for bit with fbgemm's TBE over
the static weights (the kernel TorchRec's sharded tables run: it multiplies the sum by
1 / length, as dynemb does), and within one ulp of the unsharded module, whose
nn.EmbeddingBag divides the sum by the length instead (core/pooling.h)."""

import pytest
import torch

from tests.support import fbgemm_reference as fb
from tests.support.static_models import (
    TABLES,
    batch,
    dynamic_twin,
    state_dict_sources,
    static_model,
    train_static,
)

STEPS = 4
POOLINGS = [("SUM", False), ("SUM", True), ("MEAN", False)]  # (pooling, weighted)


def _sharded_kernel_output(static, pooling: str, kjt) -> torch.Tensor:
    """What fbgemm's CPU TBE (TorchRec's sharded kernel) pools from the static weights."""
    tbe = fb.make_fbgemm_tbe([r for r, _ in TABLES.values()], [d for _, d in TABLES.values()],
                             None, "sgd", pooling.lower(), 0.0, 1e-8)  # fmt: skip
    state = static.state_dict()
    for t, name in enumerate(TABLES):
        fb.set_rows(tbe, t, state[f"embedding_bags.{name}.weight"])
    return tbe(kjt.values(), kjt.offsets(), per_sample_weights=kjt.weights_or_none()).detach()


def _within_one_ulp(got: torch.Tensor, want: torch.Tensor) -> bool:
    inf = torch.tensor(float("inf"))
    neighbours = (torch.nextafter(want, inf), torch.nextafter(want, -inf))
    return bool(((got == want) | (got == neighbours[0]) | (got == neighbours[1])).all())


@pytest.mark.parametrize(("pooling", "weighted"), POOLINGS)
def test_converted_model_matches_static_model_bit_for_bit_then_trains_on(pooling, weighted, device):
    g = torch.Generator().manual_seed(1)
    static = static_model(pooling=pooling, weighted=weighted)
    train_static(static, STEPS, g, weighted)
    dynamic = dynamic_twin(state_dict_sources(static), device, pooling=pooling)
    optimizer = torch.optim.SGD(static.parameters(), lr=dynamic.get_learning_rate())
    for step in range(STEPS):
        kjt, indices, offsets = batch(g, weighted=weighted)
        weights = kjt.weights_or_none()
        want = static(kjt).values()
        got = dynamic(indices.to(device), offsets.to(device),
                      None if weights is None else weights.to(device))  # fmt: skip
        if step == 0:  # every key new: rows straight from the static tables
            got0, want0 = got.detach().cpu(), want.detach()
            assert torch.equal(got0, _sharded_kernel_output(static, pooling, kjt))
            if pooling == "MEAN":  # nn.EmbeddingBag divides: one rounding apart
                assert _within_one_ulp(got0, want0), (got0 - want0).abs().max()
            else:
                assert torch.equal(got0, want0), "first batch not bit-exact"
        torch.testing.assert_close(got.detach().cpu(), want.detach(), atol=1e-6, rtol=0)
        grad = torch.randn(want.shape, generator=g)
        optimizer.zero_grad()
        want.backward(grad)
        optimizer.step()
        got.backward(grad.to(device))
    # Trained on: every key the dynamic tables hold has the static table's trained row.
    for t, (name, (rows, _)) in enumerate(TABLES.items()):
        weight = static.state_dict()[f"embedding_bags.{name}.weight"]
        keys = torch.arange(rows)
        values, found = dynamic.tables[t].find(keys.to(device))
        assert bool(found.any())
        torch.testing.assert_close(
            values.cpu()[found.cpu()], weight[found.cpu()], atol=1e-6, rtol=0
        )


def test_keys_outside_the_static_table_get_the_initializer_row(device):
    static = static_model()
    plain = dynamic_twin({}, device)  # no source: the initializer's rows
    warm = dynamic_twin(state_dict_sources(static), device)
    keys = torch.tensor([3, 50, -1, 2**40], device=device)  # 50: past t0's 50 rows
    got = warm.tables[0].find_or_insert(keys)
    want = plain.tables[0].find_or_insert(keys)
    weight = static.state_dict()["embedding_bags.t0.weight"]
    assert torch.equal(got[0].cpu(), weight[3])
    assert torch.equal(got[1:], want[1:])
    assert not torch.equal(want[0].cpu(), weight[3])
