"""The issue's test: a TorchRec model trained some steps on static tables, converted to
dynamic tables that warm-start from its state dict, gives bit for bit the static
model's outputs on its first batch, and trains on as the static model does."""

import torch

from tests.warm_start.static_models import (
    TABLES,
    batch,
    dynamic_twin,
    state_dict_sources,
    static_model,
    train_static,
)

STEPS = 4


def test_converted_model_matches_static_model_bit_for_bit_then_trains_on(device):
    g = torch.Generator().manual_seed(1)
    static = static_model()
    train_static(static, STEPS, g)
    dynamic = dynamic_twin(state_dict_sources(static), device)
    optimizer = torch.optim.SGD(static.parameters(), lr=dynamic.get_learning_rate())
    for step in range(STEPS):
        kjt, indices, offsets = batch(g)
        want = static(kjt).values()
        got = dynamic(indices.to(device), offsets.to(device))
        if step == 0:  # every key new: rows straight from the static tables
            assert torch.equal(got.detach().cpu(), want.detach()), "first batch not bit-exact"
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
