"""The autograd glue of BatchedDynamicEmbeddingTables: one forward, at most one update.

The optimizer update happens inside backward, in place in the tables, so a backward
is not a pure function of the forward's saved state: running it twice (a second
``backward(retain_graph=True)`` over the same graph) would apply the update twice.
The second backward of a forward that trained therefore raises. Which backward
trains is decided by the forward: a training-mode forward's backward applies its
update even if ``.eval()`` was called in between; an eval-mode forward's backward is
a no-op (the module records its mode in the saved state, see ``_lookup``).
"""

import torch

SECOND_BACKWARD = (
    "dynemb: a second backward through the same forward of BatchedDynamicEmbeddingTables: "
    "its fused optimizer update was applied by the first backward and is applied once "
    "per forward (retain_graph=True backwards are not supported); run forward again for "
    "each backward"
)


def readable_rows(grad: torch.Tensor) -> torch.Tensor:
    """``grad`` as the backward ops read it (rows of unit column stride, any row stride),
    copying as little as possible. A gradient broadcast over the batch (``out.sum()``'s
    is an expanded scalar: strides (0, 0)) becomes one materialised row read by every
    sample (strides (0, 1)), not a (B, width) copy of it."""
    if grad.dim() == 2 and grad.stride(1) == 1:
        return grad
    if grad.dim() == 2 and grad.stride(0) == 0:
        return grad[:1].contiguous().expand(grad.shape)
    return grad.contiguous()


class LookupFunction(torch.autograd.Function):
    """``apply(passes, indices, offsets, weights, batch_size, placeholder)``.

    ``passes``: the module's ``(lookup, apply_gradients)``; ``lookup`` returns
    ``(output, saved)`` and ``apply_gradients(saved, grad, batch_size)`` returns whether
    it updated anything (then a later backward of this forward raises).
    """

    @staticmethod
    def forward(ctx, passes, indices, offsets, weights, batch_size, _placeholder):
        lookup, apply_gradients = passes
        out, saved = lookup(indices, offsets, weights, batch_size)
        ctx.apply_gradients, ctx.saved, ctx.batch_size = apply_gradients, saved, batch_size
        ctx.applied = False
        return out

    @staticmethod
    def backward(ctx, grad_out):
        if ctx.applied:
            raise RuntimeError(SECOND_BACKWARD)
        ctx.applied = ctx.apply_gradients(ctx.saved, readable_rows(grad_out), ctx.batch_size)
        if ctx.applied:
            ctx.saved = None  # the rows' slots and the batch's keys: no longer needed
        return None, None, None, None, None, None


__all__ = ["LookupFunction", "SECOND_BACKWARD", "readable_rows"]
