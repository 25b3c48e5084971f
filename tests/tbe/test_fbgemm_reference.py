"""Checks our understanding of the peer: fbgemm's CPU TBE against hand computations.

Every claim of tests/support/fbgemm_reference.py's docstring is verified here on one table of
2 rows, dim 4, one step (a few checks use 3 rows, 2 tables or 2 steps), then the
pure-PyTorch references are checked against fbgemm on random multi-step input.

The hand example: rows W (below), bags {0, 0, 1}, {1}, {} (B = 3, an empty bag),
output gradient G. With SUM pooling the reduced row gradients are
``g0 = 2 * G[0]`` (row 0 twice in bag 0) and ``g1 = G[0] + G[1]``.
"""

import math

import pytest
import torch

from tests.support.fbgemm_reference import (
    adagrad_reference_step,
    adam_reference_step,
    bag_row_grads,
    fbgemm_train_step,
    get_optimizer_state,
    get_rows,
    make_fbgemm_tbe,
    rowwise_adagrad_reference_step,
    set_optimizer_state,
    set_rows,
    sgd_reference_step,
)

pytestmark = pytest.mark.no_emulated_pass("fbgemm's TBE and the PyTorch references: no dynemb op")

W = torch.tensor([[1.0, 2.0, 3.0, 4.0], [-1.0, 0.5, 2.0, -3.0]])
INDICES = torch.tensor([0, 0, 1, 1])
OFFSETS = torch.tensor([0, 3, 4, 4])
G = torch.tensor([[1.0, -2.0, 0.5, 3.0], [2.0, 1.0, -1.0, 0.0], [7.0, 7.0, 7.0, 7.0]])
# Row gradients by hand.
G0_SUM = torch.tensor([2.0, -4.0, 1.0, 6.0])  # 2 * G[0]
G1_SUM = torch.tensor([3.0, -1.0, -0.5, 3.0])  # G[0] + G[1]
G0_MEAN = torch.tensor([2 / 3, -4 / 3, 1 / 3, 2.0])  # 2 * G[0] / 3
G1_MEAN = torch.tensor([7 / 3, 1 / 3, -5 / 6, 1.0])  # G[0] / 3 + G[1] / 1
LR = 0.1
EPS = 0.5  # large, so that sqrt(s) + eps and sqrt(s + eps) differ clearly


def close(actual: torch.Tensor, expected) -> None:
    torch.testing.assert_close(actual, torch.as_tensor(expected, dtype=actual.dtype))


def tbe_with_w(optimizer: str, pooling: str = "sum", **kwargs):
    tbe = make_fbgemm_tbe([2], [4], None, optimizer, pooling, LR, EPS, **kwargs)
    set_rows(tbe, 0, W)
    return tbe


@pytest.mark.parametrize("pooling", ["sum", "mean"])
def test_forward_pools_and_empty_bag_is_zero(pooling):
    out = fbgemm_train_step(tbe_with_w("sgd", pooling), INDICES, OFFSETS, grad_output=G)
    bag0 = 2 * W[0] + W[1]
    close(out, torch.stack([bag0 / 3 if pooling == "mean" else bag0, W[1], torch.zeros(4)]))


@pytest.mark.parametrize(
    ("pooling", "g0", "g1"), [("sum", G0_SUM, G1_SUM), ("mean", G0_MEAN, G1_MEAN)]
)
def test_sgd_is_w_minus_lr_g_with_mean_dividing_by_bag_length(pooling, g0, g1):
    tbe = tbe_with_w("sgd", pooling)
    fbgemm_train_step(tbe, INDICES, OFFSETS, grad_output=G)
    close(get_rows(tbe, 0), torch.stack([W[0] - LR * g0, W[1] - LR * g1]))
    assert get_optimizer_state(tbe, 0) is None


def test_adagrad_elementwise_state_and_eps_outside_sqrt():
    tbe = tbe_with_w("adagrad")
    fbgemm_train_step(tbe, INDICES, OFFSETS, grad_output=G)
    # Duplicates are reduced first: row 0's state is (2 G[0])^2, not 2 * G[0]^2.
    s0 = torch.tensor([4.0, 16.0, 1.0, 36.0])
    s1 = torch.tensor([9.0, 1.0, 0.25, 9.0])
    close(get_optimizer_state(tbe, 0), torch.stack([s0, s1]))
    expected = torch.stack(
        [W[0] - LR * G0_SUM / (s0.sqrt() + EPS), W[1] - LR * G1_SUM / (s1.sqrt() + EPS)]
    )
    close(get_rows(tbe, 0), expected)
    inside = W[0] - LR * G0_SUM / (s0 + EPS).sqrt()
    assert not torch.allclose(get_rows(tbe, 0)[0], inside)


@pytest.mark.parametrize(
    ("pooling", "g0", "g1", "s0", "s1"),
    [
        # s = mean over the dim of g^2
        ("sum", G0_SUM, G1_SUM, (4 + 16 + 1 + 36) / 4, (9 + 1 + 0.25 + 9) / 4),
        (
            "mean",
            G0_MEAN,
            G1_MEAN,
            (4 / 9 + 16 / 9 + 1 / 9 + 4) / 4,
            (49 / 9 + 1 / 9 + 25 / 36 + 1) / 4,
        ),
    ],
)
def test_rowwise_adagrad_state_is_mean_square_and_eps_outside_sqrt(pooling, g0, g1, s0, s1):
    tbe = tbe_with_w("rowwise_adagrad", pooling)
    fbgemm_train_step(tbe, INDICES, OFFSETS, grad_output=G)
    close(get_optimizer_state(tbe, 0), [s0, s1])
    expected = torch.stack(
        [W[0] - LR * g0 / (math.sqrt(s0) + EPS), W[1] - LR * g1 / (math.sqrt(s1) + EPS)]
    )
    close(get_rows(tbe, 0), expected)


def test_rowwise_adagrad_state_accumulates_over_steps():
    tbe = tbe_with_w("rowwise_adagrad")
    set_optimizer_state(tbe, 0, torch.tensor([1.0, 2.0]))
    # One bag {0}, gradient ones: row 0 gets g = 1, mean square 1; row 1 is untouched.
    fbgemm_train_step(tbe, torch.tensor([0]), torch.tensor([0, 1]))
    w0 = W[0] - LR / (math.sqrt(2.0) + EPS)
    fbgemm_train_step(tbe, torch.tensor([0]), torch.tensor([0, 1]))
    close(get_optimizer_state(tbe, 0), [3.0, 2.0])
    close(get_rows(tbe, 0), torch.stack([w0 - LR / (math.sqrt(3.0) + EPS), W[1]]))


@pytest.mark.parametrize("optimizer", ["sgd", "adagrad", "rowwise_adagrad"])
def test_untouched_rows_and_their_state_do_not_change(optimizer):
    tbe = make_fbgemm_tbe([3], [4], None, optimizer, "sum", LR, EPS)
    rows = torch.arange(12.0).view(3, 4)
    set_rows(tbe, 0, rows)
    fbgemm_train_step(tbe, torch.tensor([1]), torch.tensor([0, 1]))
    after = get_rows(tbe, 0)
    close(after[[0, 2]], rows[[0, 2]])
    assert not torch.equal(after[1], rows[1])
    state = get_optimizer_state(tbe, 0)
    if state is not None:
        assert not state[[0, 2]].any() and state[1].all()


@pytest.mark.parametrize("optimizer", ["sgd", "adagrad", "rowwise_adagrad"])
@pytest.mark.parametrize("mode", ["none", "l2", "decouple"])
def test_weight_decay_is_ignored_on_cpu(optimizer, mode):
    plain = tbe_with_w(optimizer)
    decayed = tbe_with_w(optimizer, weight_decay=0.5, weight_decay_mode=mode)
    for tbe in (plain, decayed):
        fbgemm_train_step(tbe, INDICES, OFFSETS, grad_output=G)
    close(get_rows(decayed, 0), get_rows(plain, 0))


def test_per_sample_weights_with_sum():
    tbe = tbe_with_w("sgd")
    psw = torch.tensor([2.0, 1.0, 0.5, 3.0], requires_grad=True)
    out = fbgemm_train_step(tbe, INDICES, OFFSETS, psw, grad_output=G)
    close(out, torch.stack([3 * W[0] + 0.5 * W[1], 3 * W[1], torch.zeros(4)]))
    g0, g1 = 3 * G[0], 0.5 * G[0] + 3 * G[1]
    close(get_rows(tbe, 0), torch.stack([W[0] - LR * g0, W[1] - LR * g1]))
    close(psw.grad, [W[0] @ G[0], W[0] @ G[0], W[1] @ G[0], W[1] @ G[1]])


def test_mean_with_per_sample_weights_forward_divides_but_backward_does_not():
    """fbgemm CPU quirk: MEAN's forward divides by L, its weighted backward does not."""
    tbe = tbe_with_w("sgd", "mean")
    psw = torch.tensor([2.0, 1.0, 0.5, 3.0], requires_grad=True)
    out = fbgemm_train_step(tbe, INDICES, OFFSETS, psw, grad_output=G)
    close(out, torch.stack([(3 * W[0] + 0.5 * W[1]) / 3, 3 * W[1], torch.zeros(4)]))
    g0, g1 = 3 * G[0], 0.5 * G[0] + 3 * G[1]  # SUM's gradients: no / 3 for bag 0
    close(get_rows(tbe, 0), torch.stack([W[0] - LR * g0, W[1] - LR * g1]))
    close(psw.grad, [W[0] @ G[0], W[0] @ G[0], W[1] @ G[0], W[1] @ G[1]])


def test_adam_is_refused_on_cpu():
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    from fbgemm_gpu.split_table_batched_embeddings_ops_common import (
        ComputeDevice,
        EmbeddingLocation,
    )
    from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
        SplitTableBatchedEmbeddingBagsCodegen,
    )

    spec = [(2, 4, EmbeddingLocation.HOST, ComputeDevice.CPU)]
    with pytest.raises(AssertionError, match="adam is not supported in CPU mode"):
        SplitTableBatchedEmbeddingBagsCodegen(spec, optimizer=EmbOptimType.ADAM)


def test_out_of_range_index_is_an_error():
    with pytest.raises(RuntimeError):
        fbgemm_train_step(tbe_with_w("sgd"), torch.tensor([0, 2]), torch.tensor([0, 1, 2]))


def test_two_tables_with_a_shared_table_layout():
    """feature_table_map [0, 0, 1]: output columns are features in order, dims 4, 4, 8."""
    tbe = make_fbgemm_tbe([2, 3], [4, 8], [0, 0, 1], "sgd", "sum", LR, EPS)
    t1 = torch.arange(24.0).view(3, 8)
    set_rows(tbe, 0, W)
    set_rows(tbe, 1, t1)
    # B = 1: feature 0 -> [0], feature 1 -> [1, 1], feature 2 (table 1) -> [2].
    out = fbgemm_train_step(tbe, torch.tensor([0, 1, 1, 2]), torch.tensor([0, 1, 3, 4]))
    close(out, torch.cat([W[0], 2 * W[1], t1[2]]).unsqueeze(0))
    close(get_rows(tbe, 0), W - LR * torch.tensor([[1.0], [2.0]]))
    close(get_rows(tbe, 1), torch.cat([t1[:2], t1[2:] - LR]))


def shared_table_step(optimizer: str, fmap: list[int]):
    """Tables 0 and 1 (2 rows, dim 4, zeros); B = 1, each feature looks up row 0."""
    tbe = make_fbgemm_tbe([2, 2], [4, 4], fmap, optimizer, "sum", LR, EPS)
    for t in (0, 1):
        set_rows(tbe, t, torch.zeros(2, 4))
    fbgemm_train_step(tbe, torch.tensor([0, 0, 0]), torch.tensor([0, 1, 2, 3]))
    return tbe


def test_shared_table_with_adjacent_features_gets_one_exact_update():
    tbe = shared_table_step("adagrad", [0, 0, 1])
    close(get_optimizer_state(tbe, 0)[0], [4.0] * 4)  # (1 + 1)^2
    close(get_rows(tbe, 0)[0], [-LR * 2 / (2 + EPS)] * 4)


def test_shared_table_with_non_adjacent_features_is_not_exact():
    """fbgemm CPU quirk: features [0, 1, 0] reduce table 0 per feature run."""
    tbe = shared_table_step("adagrad", [0, 1, 0])
    close(get_optimizer_state(tbe, 0)[0], [2.0] * 4)  # 1^2 + 1^2
    two_steps = -LR / (1 + EPS) - LR / (math.sqrt(2) + EPS)
    close(get_rows(tbe, 0)[0], [two_steps] * 4)
    close(get_rows(shared_table_step("sgd", [0, 1, 0]), 0)[0], [-2 * LR] * 4)
    with pytest.raises(RuntimeError, match="c_block size"):
        shared_table_step("rowwise_adagrad", [0, 1, 0])


# --- the pure references against fbgemm, several random steps -----------------------


def random_batch(gen: torch.Generator, num_rows: int, batch: int, max_len: int):
    lengths = torch.randint(0, max_len + 1, (batch,), generator=gen)
    offsets = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)])
    indices = torch.randint(0, num_rows, (int(lengths.sum()),), generator=gen)
    return indices, offsets


@pytest.mark.parametrize("optimizer", ["sgd", "adagrad", "rowwise_adagrad"])
@pytest.mark.parametrize("pooling", ["sum", "mean"])
def test_references_match_fbgemm_over_steps(optimizer, pooling):
    num_rows, dim, batch = 10, 8, 6
    gen = torch.Generator().manual_seed(0)
    tbe = make_fbgemm_tbe([num_rows], [dim], None, optimizer, pooling, LR, 1e-3)
    rows = torch.randn(num_rows, dim, generator=gen)
    set_rows(tbe, 0, rows)
    state = torch.zeros(num_rows, dim) if optimizer == "adagrad" else torch.zeros(num_rows)
    for _ in range(4):
        indices, offsets = random_batch(gen, num_rows, batch, 5)
        grad_out = torch.randn(batch, dim, generator=gen)
        fbgemm_train_step(tbe, indices, offsets, grad_output=grad_out)
        ids, grads = bag_row_grads(indices, offsets, grad_out, pooling)
        if optimizer == "sgd":
            rows[ids] = sgd_reference_step(rows[ids], grads, LR)
            continue
        step = adagrad_reference_step if optimizer == "adagrad" else rowwise_adagrad_reference_step
        rows[ids], state[ids] = step(rows[ids], state[ids], grads, LR, 1e-3)
    close(get_rows(tbe, 0), rows)
    if optimizer != "sgd":
        close(get_optimizer_state(tbe, 0), state)


# --- the Adam reference (fbgemm's GPU rule: CPU fbgemm has no Adam) -------------------


def test_adam_reference_first_step_by_hand():
    # At t = 1 the bias corrections cancel: m_hat = g, v_hat = g^2.
    g = torch.tensor([[2.0, -4.0, 1.0, 6.0]])
    w, m, v = adam_reference_step(
        W[:1], torch.zeros(1, 4), torch.zeros(1, 4), g, 1, LR, 0.9, 0.999, EPS, 0.1
    )
    close(m, 0.1 * g)
    close(v, 0.001 * g * g)
    close(w, W[:1] - LR * (g / (g.abs() + EPS) + 0.1 * W[:1]))


def test_adam_reference_equals_adamw_when_every_row_is_touched():
    gen = torch.Generator().manual_seed(0)
    param = torch.nn.Parameter(torch.randn(3, 4, generator=gen))
    opt = torch.optim.AdamW([param], lr=LR, betas=(0.9, 0.99), eps=1e-3, weight_decay=0.2)
    rows, m, v = param.detach().clone(), torch.zeros(3, 4), torch.zeros(3, 4)
    for step in range(1, 4):
        grad = torch.randn(3, 4, generator=gen)
        param.grad = grad.clone()
        opt.step()
        rows, m, v = adam_reference_step(rows, m, v, grad, step, LR, 0.9, 0.99, 1e-3, 0.2)
    close(rows, param.detach())


def test_adam_reference_is_lazy_with_a_global_step():
    """Row "a" is touched at steps 1 and 3 only: at step 2 nothing of it changes, and
    step 3 uses t = 3 (global), not its own count of 2."""
    b1, b2, g1, g3 = 0.9, 0.999, torch.tensor([1.0, -2.0]), torch.tensor([0.5, 0.5])
    w0 = torch.tensor([1.0, 1.0])
    rows, m, v = adam_reference_step({"a": w0}, {}, {}, {"a": g1}, 1, LR, b1, b2, EPS)
    # step 2 touches only "b": "a" is not in the batch, its entries are not passed.
    rows, m, v = adam_reference_step(rows, m, v, {"a": g3}, 3, LR, b1, b2, EPS)
    m3 = b1 * (1 - b1) * g1 + (1 - b1) * g3
    v3 = b2 * (1 - b2) * g1 * g1 + (1 - b2) * g3 * g3
    w1 = w0 - LR * g1 / (g1.abs() + EPS)
    w3 = w1 - LR * (m3 / (1 - b1**3)) / ((v3 / (1 - b2**3)).sqrt() + EPS)
    close(m["a"], m3)
    close(v["a"], v3)
    close(rows["a"], w3)
