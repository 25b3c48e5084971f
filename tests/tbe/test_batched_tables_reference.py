"""BatchedDynamicEmbeddingTables against pure-PyTorch references where fbgemm has no CPU peer.

- ADAM: fbgemm's sparse Adam (touched rows only, global step) from fbgemm_reference.
- Sequence (NONE) lookups: nn.Embedding rows + the same optimizer rule in PyTorch.
- Weight decay (fbgemm's CPU kernels ignore it): L2 / decoupled rules in PyTorch.

The Adam and sequence tests run dynemb's tables on each test device (``device``).
"""

import pytest
import torch
from torch import nn

from dynemb import BatchedDynamicEmbeddingTables, DynamicEmbPoolingMode, DynamicEmbTableOptions
from dynemb.optimizer import EmbOptimType
from tests.support import fbgemm_reference as fb

ROWS, DIM = 25, 8


def spread(ids):
    return ids * -7046029254386353131 + 99


def make(optimizer, pooling, lr=0.02, weight_decay=0.0, fmap=(0, 0), dims=(DIM,), device="cpu"):
    m = BatchedDynamicEmbeddingTables(
        [DynamicEmbTableOptions(dim=d, max_capacity=256, bucket_capacity=16) for d in dims],
        feature_table_map=list(fmap),
        pooling_mode=pooling,
        optimizer=optimizer,
        learning_rate=lr,
        eps=1e-6,
        beta1=0.8,
        beta2=0.95,
        weight_decay=weight_decay,
        device=device,
    )
    start = [
        0.1 * torch.randn(ROWS, d, generator=torch.Generator().manual_seed(t))
        for t, d in enumerate(dims)
    ]
    for t in range(len(dims)):
        m.tables[t].insert_or_assign(spread(torch.arange(ROWS)).to(device), start[t].to(device))
    return m, [s.clone() for s in start]


def batch(g, num_features, batch_size=5):
    lengths = torch.randint(0, 4, (num_features * batch_size,), generator=g)
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])
    indices = torch.randint(0, ROWS, (int(offsets[-1]),), generator=g)
    return indices, offsets


def rows_of(m, t=0):
    values, found = m.tables[t].find(spread(torch.arange(ROWS)).to(m.device))
    assert bool(found.all())
    return values.cpu()


@pytest.mark.parametrize("weight_decay", [0.0, 0.1])
def test_adam_matches_fbgemm_sparse_adam(weight_decay, device):
    g = torch.Generator().manual_seed(0)
    m, (rows,) = make(
        EmbOptimType.ADAM, DynamicEmbPoolingMode.SUM, weight_decay=weight_decay, device=device
    )
    state_m, state_v = torch.zeros(ROWS, DIM), torch.zeros(ROWS, DIM)
    for step in range(1, 21):
        indices, offsets = batch(g, 2)
        grad_out = torch.randn(5, 2 * DIM, generator=g)
        out = m(spread(indices).to(device), offsets.to(device))
        # Reference: pooled output from `rows`, then the reduced gradient per touched row.
        B = 5
        want = torch.cat(
            [
                torch.stack(
                    [
                        rows[indices[offsets[f * B + b] : offsets[f * B + b + 1]]].sum(0)
                        for b in range(B)
                    ]
                )
                for f in range(2)
            ],
            dim=1,
        )
        torch.testing.assert_close(out.detach().cpu(), want, atol=1e-5, rtol=0)
        out.backward(grad_out.to(device))
        grads = torch.zeros(ROWS, DIM)
        for f in range(2):
            fo = offsets[f * B : (f + 1) * B + 1]
            ids, gr = fb.bag_row_grads(
                indices[fo[0] : fo[-1]], fo - fo[0], grad_out[:, f * DIM : (f + 1) * DIM]
            )
            grads.index_add_(0, ids, gr)
        touched = torch.unique(indices)
        new_rows, new_m, new_v = fb.adam_reference_step(
            rows[touched],
            state_m[touched],
            state_v[touched],
            grads[touched],
            step,
            0.02,
            0.8,
            0.95,
            1e-6,
            weight_decay,
        )
        rows[touched], state_m[touched], state_v[touched] = new_rows, new_m, new_v
        torch.testing.assert_close(
            rows_of(m), rows, atol=1e-5, rtol=0, msg=f"rows after step {step}"
        )


RULES = {
    EmbOptimType.EXACT_SGD: "sgd",
    EmbOptimType.EXACT_ADAGRAD: "adagrad",
    EmbOptimType.EXACT_ROWWISE_ADAGRAD: "rowwise_adagrad",
}


def reference_update(kind, rows, state, grads, lr, weight_decay):
    """The exact rules with L2 weight decay (g += weight_decay * w), touched rows only."""
    g = grads + weight_decay * rows
    if kind == "sgd":
        return rows - lr * g, state
    if kind == "adagrad":
        state = state + g * g
        return rows - lr * g / (state.sqrt() + 1e-6), state
    state = state + (g * g).mean(1, keepdim=True)
    return rows - lr * g / (state.sqrt() + 1e-6), state


@pytest.mark.parametrize("optimizer", list(RULES))
@pytest.mark.parametrize("weight_decay", [0.0, 0.05])
def test_sequence_mode_matches_nn_embedding_with_the_same_rule(optimizer, weight_decay, device):
    g = torch.Generator().manual_seed(1)
    m, (start,) = make(
        optimizer, DynamicEmbPoolingMode.NONE, weight_decay=weight_decay, fmap=(0, 0, 0),
        device=device,
    )  # fmt: skip
    ref = nn.Embedding(ROWS, DIM)
    ref.weight.data.copy_(start)
    state = torch.zeros(ROWS, DIM if RULES[optimizer] == "adagrad" else 1)
    for step in range(15):
        indices, offsets = batch(g, 3)
        out = m(spread(indices).to(device), offsets.to(device))
        want = ref(indices)
        torch.testing.assert_close(out.detach().cpu(), want.detach(), atol=1e-5, rtol=0)
        grad_out = torch.randn(out.shape, generator=g)
        out.backward(grad_out.to(device))
        grads = torch.zeros(ROWS, DIM).index_add_(0, indices, grad_out)
        touched = torch.unique(indices)
        new_rows, new_state = reference_update(
            RULES[optimizer],
            ref.weight.data[touched],
            state[touched],
            grads[touched],
            0.02,
            weight_decay,
        )
        ref.weight.data[touched], state[touched] = new_rows, new_state
        torch.testing.assert_close(
            rows_of(m), ref.weight.data, atol=1e-5, rtol=0, msg=f"step {step}"
        )


def test_learning_rate_can_change_between_steps():
    m, (start,) = make(EmbOptimType.EXACT_SGD, DynamicEmbPoolingMode.SUM, fmap=(0,))
    indices, offsets = torch.tensor([3]), torch.tensor([0, 1])
    m(spread(indices), offsets).sum().backward()
    m.set_learning_rate(0.5)
    assert m.get_learning_rate() == 0.5
    m(spread(indices), offsets).sum().backward()
    torch.testing.assert_close(rows_of(m)[3], start[3] - 0.02 - 0.5)


def test_weighted_mean_pooling_uses_the_exact_gradient():
    """fbgemm's CPU backward drops MEAN's 1/L with per-sample weights; dynemb's gradient is
    the autograd gradient of sum_i w_i * row_i / L (checked with a dense PyTorch table)."""
    g = torch.Generator().manual_seed(5)
    m, (start,) = make(EmbOptimType.EXACT_SGD, DynamicEmbPoolingMode.MEAN, lr=0.1, fmap=(0, 0))
    dense = start.clone().requires_grad_(True)
    for _ in range(5):
        indices, offsets = batch(g, 2)
        weights = torch.rand(indices.numel(), generator=g) + 0.5
        grad_out = torch.randn(5, 2 * DIM, generator=g)
        out = m(spread(indices), offsets, weights)
        bags = []
        for f in range(2):
            for b in range(5):
                a, e = offsets[f * 5 + b], offsets[f * 5 + b + 1]
                rows = dense[indices[a:e]] * weights[a:e].unsqueeze(1)
                bags.append(rows.sum(0) / max(int(e - a), 1))
        want = torch.cat([torch.stack(bags[:5]), torch.stack(bags[5:])], dim=1)
        torch.testing.assert_close(out.detach(), want.detach(), atol=1e-5, rtol=0)
        out.backward(grad_out)
        (want * grad_out).sum().backward()
        with torch.no_grad():
            dense -= 0.1 * dense.grad
            dense.grad = None
        torch.testing.assert_close(rows_of(m), dense.detach(), atol=1e-5, rtol=0)
