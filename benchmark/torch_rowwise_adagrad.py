"""Row-wise Adagrad in torch ops: the plain-torch training peer's optimizer.

fbgemm's EXACT_ROWWISE_ADAGRAD (the rule dynemb's tables train with by default), over
the sparse gradients of ``nn.EmbeddingBag(sparse=True)``: a batch's gradient rows of one
row are summed first (``coalesce``), then each distinct row ``r`` with summed gradient
``g`` (dim,) and one state value ``s[r]``::

    s[r] += mean(g * g)
    w[r] -= lr * g / (sqrt(s[r]) + eps)

Rows the batch does not touch keep their weights and state. No weight decay. Written
with torch ops only (no fbgemm), so that it runs wherever torch does; checked against a
dense reference in ``tests/tbe/test_torch_rowwise_adagrad.py``.

Example::

    >>> bag = torch.nn.EmbeddingBag(1000, 16, mode="sum", sparse=True)
    >>> opt = RowwiseAdagrad(bag.parameters(), lr=0.01, eps=1e-8)
    >>> bag(torch.tensor([3, 7, 3]), torch.tensor([0, 2])).sum().backward()
    >>> opt.step()  # rows 3 and 7 move; opt.state[bag.weight]["sum"] is (1000,)
"""

import torch


class RowwiseAdagrad(torch.optim.Optimizer):
    """EXACT_ROWWISE_ADAGRAD over sparse gradients (see the module doc).

    Args:
        params: 2-D parameters (rows, dim) whose gradients are sparse.
        lr: learning rate (> 0).
        eps: added to the square root of the state (> 0).

    Raises:
        ValueError: ``lr`` or ``eps`` is not positive; at ``step``, a parameter that is
            not 2-D or whose gradient is dense.
    """

    def __init__(self, params, lr: float = 0.01, eps: float = 1e-8) -> None:
        if not lr > 0 or not eps > 0:
            raise ValueError(f"RowwiseAdagrad: `lr` and `eps` must be > 0, got {lr}, {eps}")
        super().__init__(params, {"lr": lr, "eps": eps})

    @torch.no_grad()
    def step(self, closure=None):
        """Updates every parameter with a gradient; returns ``closure()``'s loss, if any."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            for weight in group["params"]:
                if weight.grad is not None:
                    self._update(weight, group["lr"], group["eps"])
        return loss

    def _update(self, weight: torch.Tensor, lr: float, eps: float) -> None:
        if weight.dim() != 2 or not weight.grad.is_sparse:
            raise ValueError(
                "RowwiseAdagrad: each parameter must be 2-D with a sparse gradient "
                f"(nn.EmbeddingBag(sparse=True)), got shape {tuple(weight.shape)} with a "
                f"{'sparse' if weight.grad.is_sparse else 'dense'} gradient"
            )
        state = self.state[weight]
        if not state:
            state["sum"] = torch.zeros(weight.shape[0], dtype=weight.dtype, device=weight.device)
        grad = weight.grad.coalesce()  # one (dim,) gradient per distinct row
        rows, g = grad.indices()[0], grad.values()
        total = state["sum"]
        total.index_add_(0, rows, g.square().mean(dim=1))
        scale = total[rows].sqrt_().add_(eps).reciprocal_().mul_(lr)
        weight.index_add_(0, rows, g * scale.unsqueeze(1), alpha=-1)
