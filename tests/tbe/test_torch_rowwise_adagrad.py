"""The plain-torch training peer's optimizer (benchmark/torch_rowwise_adagrad.py) is
EXACT_ROWWISE_ADAGRAD: several steps of nn.EmbeddingBag(sparse=True) + RowwiseAdagrad
equal a dense reference of the rule (every row, dense gradients: an untouched row has a
zero gradient, so its weights and state stay), on each test device."""

import pytest
import torch

from benchmark.torch_rowwise_adagrad import RowwiseAdagrad

pytestmark = pytest.mark.no_emulated_pass("torch ops only: no dynemb op, no executor")

ROWS, DIM, LR, EPS = 50, 6, 0.05, 1e-8


def dense_reference_step(weight, state, ids, offsets, coeff):
    """One step of the rule on dense tensors: ``(weight, state)`` after it."""
    w = weight.clone().requires_grad_()
    pooled = torch.nn.functional.embedding_bag(ids, w, offsets, mode="sum")
    (pooled * coeff).sum().backward()
    g = w.grad
    state = state + (g * g).mean(dim=1)
    return weight - LR * g / (state.sqrt() + EPS).unsqueeze(1), state


@pytest.mark.parametrize("seed", [0, 1])
def test_steps_match_the_dense_reference(device, seed):
    gen = torch.Generator().manual_seed(seed)
    bag = torch.nn.EmbeddingBag(ROWS, DIM, mode="sum", sparse=True).double()
    with torch.no_grad():
        bag.weight.copy_(torch.randn(ROWS, DIM, generator=gen, dtype=torch.float64))
    weight, state = bag.weight.detach().clone(), torch.zeros(ROWS, dtype=torch.float64)
    bag = bag.to(device)
    opt = RowwiseAdagrad(bag.parameters(), lr=LR, eps=EPS)
    for _ in range(4):
        # Ids over the first 30 rows only, repeated within and across bags.
        ids = torch.randint(0, 30, (40,), generator=gen)
        offsets = torch.tensor([0, 5, 5, 17, 33])  # one empty bag
        coeff = torch.randn(offsets.numel(), DIM, generator=gen, dtype=torch.float64)
        opt.zero_grad(set_to_none=True)
        (bag(ids.to(device), offsets.to(device)) * coeff.to(device)).sum().backward()
        opt.step()
        weight, state = dense_reference_step(weight, state, ids, offsets, coeff)
    torch.testing.assert_close(bag.weight.detach().cpu(), weight, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(opt.state[bag.weight]["sum"].cpu(), state, rtol=1e-12, atol=0)
    assert torch.equal(opt.state[bag.weight]["sum"][30:].cpu(), torch.zeros(ROWS - 30).double())


def test_a_dense_gradient_is_refused(device):
    bag = torch.nn.EmbeddingBag(ROWS, DIM, mode="sum", sparse=False).to(device)
    opt = RowwiseAdagrad(bag.parameters(), lr=LR, eps=EPS)
    bag(torch.tensor([1, 2], device=device), torch.tensor([0], device=device)).sum().backward()
    with pytest.raises(ValueError, match="sparse gradient"):
        opt.step()


def test_a_non_positive_learning_rate_is_refused():
    with pytest.raises(ValueError, match="`lr` and `eps` must be > 0, got 0.0"):
        RowwiseAdagrad([torch.nn.Parameter(torch.zeros(2, 2))], lr=0.0)
