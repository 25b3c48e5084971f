"""The order in which a key's gradient is summed (core pooling.h): its terms in
ascending index order, cut into chunks of 64, each chunk summed from zero and the
chunks' sums added in order to a total from zero. Checked bit for bit against the
same sums written in torch float32 ops, through EXACT_SGD at learning rate 1 (the
update is ``w - 1 * g``), for keys of 1, 64, 65 and 1,000 indices; every executor
gives these bits (tests/csrc/test_executor_parity.py)."""

import dynemb._C  # noqa: F401  (loads the op libraries)
import pytest
import torch

from dynemb import _ops

CHUNK = 64
DIM = 8


def _reference_gradient(terms: torch.Tensor) -> torch.Tensor:
    """terms: (n, DIM) float32 in index order -> the gradient in core's order."""
    total = torch.zeros(DIM)
    for c in range(0, terms.shape[0], CHUNK):
        chunk = torch.zeros(DIM)
        for t in terms[c : c + CHUNK]:
            chunk = chunk + t
        total = total + chunk
    return total


@pytest.mark.parametrize("n", [1, 64, 65, 1000])
@pytest.mark.parametrize("mode", [0, 1], ids=["sum", "mean"])
def test_a_hot_key_is_summed_in_chunks(n, mode):
    g = torch.Generator().manual_seed(n)
    # One key (slot 0) in bags of 3 indices, weighted; the grad rows of magnitudes far
    # apart, so that another order gives other bits.
    num_bags = -(-n // 3)
    offsets = torch.arange(0, 3 * num_bags + 1, 3).clamp(max=n)
    weights = torch.rand(n, generator=g)
    grad = torch.randn(num_bags, DIM, generator=g) * torch.logspace(-3, 3, num_bags)[:, None]
    inverse = torch.zeros(n, dtype=torch.int64)
    slots = torch.zeros(1, dtype=torch.int64)
    table = [
        torch.zeros(1, 16, dtype=torch.uint8), torch.zeros(16, dtype=torch.int64),
        torch.zeros(0, dtype=torch.int64), torch.zeros(0, dtype=torch.int64),
        torch.zeros(16, DIM), torch.zeros(1, dtype=torch.int32),
        torch.zeros(1, dtype=torch.uint8), torch.zeros(0, DIM), torch.zeros(0, dtype=torch.int32),
    ]  # fmt: skip
    opt = [0.0, 1.0, 1e-8, 0.9, 0.99, 0.0]  # EXACT_SGD, learning rate 1, no weight decay
    _ops._dynemb.embedding_backward(
        table, slots, inverse, offsets, weights, mode, grad, opt, 1, DIM
    )
    bag_of = torch.repeat_interleave(torch.arange(num_bags), offsets.diff())
    sizes = offsets.diff()[bag_of].float()
    scale = weights / sizes if mode == 1 else weights
    terms = scale[:, None] * grad[bag_of]
    assert torch.equal(table[4][0], torch.zeros(DIM) - 1.0 * _reference_gradient(terms))
    if n > 2 * CHUNK:  # a plain running sum gives other bits here: the check can fail
        running = torch.zeros(DIM)
        for t in terms:
            running = running + t
        assert not torch.equal(running, _reference_gradient(terms))
