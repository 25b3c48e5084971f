"""fbgemm's CPU TBE as an oracle, and pure-PyTorch references of its optimizer rules.

This is a helper module, not a test file. The peer is fbgemm_gpu's
``SplitTableBatchedEmbeddingBagsCodegen`` (fbgemm-gpu-cpu 1.8.0) with compute device
CPU and every table at ``EmbeddingLocation.HOST``; dynemb's
``BatchedDynamicEmbeddingTables`` follows the same conventions (``indices``,
``offsets`` of length ``T * B + 1`` feature-major, output ``(B, sum of dims)``)::

    tbe = make_fbgemm_tbe([2, 3], [4, 8], [0, 0, 1], "rowwise_adagrad", "sum", 0.1, 1e-8)
    set_rows(tbe, 0, torch.randn(2, 4))
    out = fbgemm_train_step(tbe, indices, offsets)     # forward, sum().backward(), update
    get_rows(tbe, 0), get_optimizer_state(tbe, 0)      # copies, to compare with dynemb's

fbgemm's CPU semantics, each verified numerically by tests/tbe/test_fbgemm_reference.py
(one table, 2 rows, dim 4, hand computation). ``g`` is the gradient of one row,
reduced over the whole batch first ("exact" optimizers: a row that appears k times
in a batch gets ONE update with the sum of its k contributions, e.g. Adagrad adds
``(g_a + g_b)^2``, not ``g_a^2 + g_b^2``). Rows absent from the batch are not
touched at all: neither their weights nor their optimizer state change.

Exception, a table shared by features that are NOT adjacent in ``feature_table_map``
(e.g. ``[0, 1, 0]``): the CPU backward reduces per run of adjacent features, not per
table. EXACT_ADAGRAD then applies one update per run (state ``g1^2 + g2^2`` and two
steps instead of ``(g1 + g2)^2`` and one); EXACT_ROWWISE_ADAGRAD raises
``RuntimeError: num of rows processed by adagrad: 0does not match c_block size``;
EXACT_SGD, being linear, is unaffected. Give a shared table adjacent features
(``[0, 0, 1]``) when fbgemm is the oracle.

- ``EXACT_SGD``: ``w -= lr * g``. No optimizer state (``split_optimizer_states()``
  returns an empty list).
- ``EXACT_ADAGRAD``: per element, ``s += g^2``; ``w -= lr * g / (sqrt(s) + eps)``.
  State ``momentum1`` of shape ``(rows, dim)``, initialised to 0.
- ``EXACT_ROWWISE_ADAGRAD``: one state value per row, the running sum of the MEAN
  over the dim of ``g^2``: ``s += sum_d(g_d^2) / dim``; then
  ``w -= lr * g / (sqrt(s) + eps)``. State ``momentum1`` of shape ``(rows,)``.
- eps sits outside the square root in both Adagrads: ``sqrt(s) + eps``, not
  ``sqrt(s + eps)``.
- Weight decay: ``weight_decay_mode`` defaults to ``WeightDecayMode.NONE``, which
  ignores ``weight_decay``. EXACT_SGD and EXACT_ADAGRAD never receive it (their
  invokers pass no weight decay argument). On CPU even EXACT_ROWWISE_ADAGRAD with
  ``L2`` or ``DECOUPLE`` mode leaves the update unchanged (verified: the CPU kernel
  of fbgemm-gpu-cpu 1.8.0 ignores weight decay). So on CPU no fbgemm optimizer
  applies weight decay: compare dynemb's weight decay against the pure references
  below (or against fbgemm's GPU rules), never against this oracle.
- Pooling: SUM is ``sum_i w_i * row_i``; MEAN divides by the bag length ``L``, and
  without per-sample weights its gradient is ``grad_out / L`` for each of the ``L``
  entries (so that ``/ L`` enters the Adagrad states too). An empty bag outputs 0.
- Per-sample weights are accepted with both SUM and MEAN. With SUM the row gradient
  is ``w_i * grad_out``. With MEAN fbgemm's CPU kernel is inconsistent: the forward
  is ``sum_i w_i * row_i / L`` but the backward is that of SUM: rows get
  ``w_i * grad_out`` and the per-sample weights (when they require grad) get
  ``<row_i, grad_out>``, neither divided by ``L``. Do not use MEAN with per-sample
  weights as an oracle. With SUM the weights' gradient ``<row_i, grad_out>`` is right.
- ADAM: refused on CPU (``AssertionError: Optimizer adam is not supported in CPU
  mode.``). ``adam_reference_step`` therefore follows fbgemm's
  GPU rule as written in fbgemm_gpu's source (``codegen/genscript/optimizers.py``,
  ``adam()``; that file is not in the wheel, so the formula below cannot be run
  against fbgemm here). What the installed package does show: the invoker
  ``split_embedding_codegen_lookup_invokers/lookup_adam.py`` passes eps, beta1,
  beta2 and weight_decay but no weight_decay_mode, and the TBE's forward passes
  ``iter`` (its global counter) to it. The rule, for the touched rows only::

      m = beta1 * m + (1 - beta1) * g
      v = beta2 * v + (1 - beta2) * g^2
      w -= lr * (m / (1 - beta1^t) / (sqrt(v / (1 - beta2^t)) + eps) + weight_decay * w)

  ``t`` is ONE global step counter of the whole TBE (``self.iter``, incremented by
  every forward call, without a check of ``self.training``; 1 at the first step),
  not a per-row count (fbgemm's
  optional ``use_rowwise_bias_correction`` does that; it is off by default). Weight
  decay is decoupled (AdamW-like: ``lr * weight_decay * w``, independent of g) and
  always on when ``weight_decay > 0``. For rows touched at every step this equals
  ``torch.optim.AdamW``; untouched rows keep w, m and v unchanged (lazy Adam).

Embedding dims must be multiples of 4 (fbgemm asserts it).
"""

from collections.abc import Sequence

import torch
from fbgemm_gpu.split_embedding_configs import EmbOptimType
from fbgemm_gpu.split_table_batched_embeddings_ops_common import (
    BoundsCheckMode,
    ComputeDevice,
    EmbeddingLocation,
    PoolingMode,
)
from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
    SplitTableBatchedEmbeddingBagsCodegen,
)
from fbgemm_gpu.tbe.config.optimizer_config import WeightDecayMode

OPTIMIZERS = {
    "sgd": EmbOptimType.EXACT_SGD,
    "adagrad": EmbOptimType.EXACT_ADAGRAD,
    "rowwise_adagrad": EmbOptimType.EXACT_ROWWISE_ADAGRAD,
}
POOLINGS = {"sum": PoolingMode.SUM, "mean": PoolingMode.MEAN}
WEIGHT_DECAY_MODES = {
    "none": WeightDecayMode.NONE,
    "l2": WeightDecayMode.L2,
    "decouple": WeightDecayMode.DECOUPLE,
}


def make_fbgemm_tbe(
    rows_per_table: Sequence[int],
    dims: Sequence[int],
    feature_table_map: Sequence[int] | None,
    optimizer: str,
    pooling: str,
    learning_rate: float,
    eps: float,
    weight_decay: float = 0.0,
    weight_decay_mode: str = "none",
) -> SplitTableBatchedEmbeddingBagsCodegen:
    """Builds fbgemm's CPU TBE (all tables on HOST) with a fused exact optimizer.

    Args:
        rows_per_table: number of rows of each table.
        dims: embedding dim of each table (multiples of 4).
        feature_table_map: table of each feature (None: one feature per table).
        optimizer: ``"sgd"``, ``"adagrad"`` or ``"rowwise_adagrad"`` (the EXACT_ ones).
        pooling: ``"sum"`` or ``"mean"``.
        learning_rate, eps: optimizer hyper-parameters (eps unused by SGD).
        weight_decay: passed through; fbgemm's CPU kernels ignore it (module docstring).
        weight_decay_mode: ``"none"`` (fbgemm's default), ``"l2"`` or ``"decouple"``.

    Returns:
        The module, in training mode, bounds checks fatal. Its weights are fbgemm's
        random initialisation and its optimizer states zero: use ``set_rows``.
    """
    specs = [
        (rows, dim, EmbeddingLocation.HOST, ComputeDevice.CPU)
        for rows, dim in zip(rows_per_table, dims, strict=True)
    ]
    return SplitTableBatchedEmbeddingBagsCodegen(
        specs,
        feature_table_map=None if feature_table_map is None else list(feature_table_map),
        optimizer=OPTIMIZERS[optimizer],
        pooling_mode=POOLINGS[pooling],
        learning_rate=learning_rate,
        eps=eps,
        weight_decay=weight_decay,
        weight_decay_mode=WEIGHT_DECAY_MODES[weight_decay_mode],
        bounds_check_mode=BoundsCheckMode.FATAL,
        device=torch.device("cpu"),
    )


def _weights_view(tbe: SplitTableBatchedEmbeddingBagsCodegen, table_index: int) -> torch.Tensor:
    return tbe.split_embedding_weights()[table_index]


def get_rows(tbe: SplitTableBatchedEmbeddingBagsCodegen, table_index: int) -> torch.Tensor:
    """A copy of table ``table_index``'s weights, shape ``(rows, dim)``."""
    return _weights_view(tbe, table_index).clone()


def set_rows(
    tbe: SplitTableBatchedEmbeddingBagsCodegen, table_index: int, rows: torch.Tensor
) -> None:
    """Overwrites every row of table ``table_index`` with ``rows`` (shape ``(rows, dim)``)."""
    with torch.no_grad():
        _weights_view(tbe, table_index).copy_(rows)


def _state_view(
    tbe: SplitTableBatchedEmbeddingBagsCodegen, table_index: int
) -> torch.Tensor | None:
    states = tbe.split_optimizer_states()
    return states[table_index][0] if states else None


def get_optimizer_state(
    tbe: SplitTableBatchedEmbeddingBagsCodegen, table_index: int
) -> torch.Tensor | None:
    """A copy of table ``table_index``'s optimizer state (fbgemm's ``momentum1``).

    Returns:
        None for EXACT_SGD; ``(rows, dim)`` Adagrad sums of squares for EXACT_ADAGRAD;
        ``(rows,)`` sums of mean squares for EXACT_ROWWISE_ADAGRAD.
    """
    state = _state_view(tbe, table_index)
    return None if state is None else state.clone()


def set_optimizer_state(
    tbe: SplitTableBatchedEmbeddingBagsCodegen, table_index: int, state: torch.Tensor
) -> None:
    """Overwrites table ``table_index``'s ``momentum1`` (shape as ``get_optimizer_state``)."""
    view = _state_view(tbe, table_index)
    if view is None:
        raise ValueError("this optimizer has no state")
    with torch.no_grad():
        view.copy_(state.reshape(view.shape))


def fbgemm_train_step(
    tbe: SplitTableBatchedEmbeddingBagsCodegen,
    indices: torch.Tensor,
    offsets: torch.Tensor,
    per_sample_weights: torch.Tensor | None = None,
    grad_output: torch.Tensor | None = None,
) -> torch.Tensor:
    """One training step: forward, backward (the fused optimizer updates the rows).

    Args:
        tbe: from ``make_fbgemm_tbe``.
        indices: int64 row ids, feature-major.
        offsets: int64, length ``T * B + 1``.
        per_sample_weights: optional float weights, one per index.
        grad_output: gradient of the loss w.r.t. the output; None means
            ``loss = out.sum()`` (a gradient of ones).

    Returns:
        The forward output ``(B, total_dim)``, detached (computed before the update).
    """
    out = tbe(indices.long(), offsets.long(), per_sample_weights=per_sample_weights)
    if grad_output is None:
        out.sum().backward()
    else:
        out.backward(grad_output)
    return out.detach()


# --- pure-PyTorch references of the rules above (touched rows only) ---------------------


def bag_row_grads(
    indices: torch.Tensor,
    offsets: torch.Tensor,
    grad_output: torch.Tensor,
    pooling: str = "sum",
    per_sample_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Reduces the gradient of ONE feature's pooled output to one gradient per unique id.

    Uses the mathematically exact rule (MEAN divides by the bag length, also with
    per-sample weights; see the module docstring for fbgemm's MEAN-weighted quirk).

    Args:
        indices, offsets: one feature, ``B`` bags (``offsets`` has ``B + 1`` entries).
        grad_output: ``(B, dim)``.
        pooling: ``"sum"`` or ``"mean"``.
        per_sample_weights: optional, one per index.

    Returns:
        ``(unique_ids, grads)``: sorted unique ids and their summed ``(n, dim)`` gradients.
    """
    lengths = offsets[1:] - offsets[:-1]
    per_index = grad_output.repeat_interleave(lengths, dim=0)
    if per_sample_weights is not None:
        per_index = per_index * per_sample_weights.unsqueeze(1)
    if pooling == "mean":
        per_index = per_index / lengths.repeat_interleave(lengths).unsqueeze(1)
    unique_ids, inverse = torch.unique(indices, return_inverse=True)
    grads = torch.zeros(len(unique_ids), grad_output.shape[1], dtype=grad_output.dtype)
    grads.index_add_(0, inverse, per_index)
    return unique_ids, grads


def sgd_reference_step(rows: torch.Tensor, grads: torch.Tensor, lr: float) -> torch.Tensor:
    """EXACT_SGD on the touched rows ``(n, dim)`` with their reduced grads; returns new rows."""
    return rows - lr * grads


def adagrad_reference_step(
    rows: torch.Tensor, state: torch.Tensor, grads: torch.Tensor, lr: float, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """EXACT_ADAGRAD on touched rows; ``state`` is ``(n, dim)``. Returns ``(rows, state)``."""
    state = state + grads * grads
    return rows - lr * grads / (state.sqrt() + eps), state


def rowwise_adagrad_reference_step(
    rows: torch.Tensor, state: torch.Tensor, grads: torch.Tensor, lr: float, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """EXACT_ROWWISE_ADAGRAD on touched rows; ``state`` is ``(n,)``. Returns ``(rows, state)``."""
    state = state + (grads * grads).mean(dim=1)
    return rows - (lr / (state.sqrt() + eps)).unsqueeze(1) * grads, state


def adam_reference_step(
    rows: torch.Tensor | dict,
    state_m: torch.Tensor | dict,
    state_v: torch.Tensor | dict,
    grads: torch.Tensor | dict,
    step: int,
    lr: float,
    beta1: float,
    beta2: float,
    eps: float,
    weight_decay: float = 0.0,
) -> tuple:
    """fbgemm-style sparse Adam (GPU rule, see the module docstring) on the touched rows.

    Args:
        rows, state_m, state_v, grads: either ``(n, dim)`` tensors aligned row by row
            (the touched unique rows, their two moments and their batch-reduced
            gradients), or dicts ``key -> (dim,) tensor`` with the same keys in all
            four (missing moments count as zeros, i.e. a fresh row).
        step: the GLOBAL step counter, 1 at the first training step, shared by all rows.
        lr, beta1, beta2, eps: hyper-parameters (eps outside the square root).
        weight_decay: decoupled, ``w -= lr * weight_decay * w``.

    Returns:
        ``(rows, state_m, state_v)``, new objects of the input kind; untouched rows
        are simply not in them.
    """
    if isinstance(rows, dict):
        return _adam_reference_dict(
            rows, state_m, state_v, grads, step, lr, beta1, beta2, eps, weight_decay
        )
    m = beta1 * state_m + (1.0 - beta1) * grads
    v = beta2 * state_v + (1.0 - beta2) * grads * grads
    m_hat = m / (1.0 - beta1**step)
    v_hat = v / (1.0 - beta2**step)
    new_rows = rows - lr * (m_hat / (v_hat.sqrt() + eps) + weight_decay * rows)
    return new_rows, m, v


def _adam_reference_dict(
    rows: dict,
    state_m: dict,
    state_v: dict,
    grads: dict,
    step: int,
    lr: float,
    beta1: float,
    beta2: float,
    eps: float,
    weight_decay: float,
) -> tuple[dict, dict, dict]:
    keys = list(grads)
    if not keys:
        return {}, {}, {}
    zeros = torch.zeros_like(grads[keys[0]])

    def stack(d: dict) -> torch.Tensor:
        return torch.stack([d.get(k, zeros) for k in keys])

    w, m, v = adam_reference_step(
        torch.stack([rows[k] for k in keys]),
        stack(state_m),
        stack(state_v),
        stack(grads),
        step,
        lr,
        beta1,
        beta2,
        eps,
        weight_decay,
    )
    return (
        dict(zip(keys, w, strict=True)),
        dict(zip(keys, m, strict=True)),
        dict(zip(keys, v, strict=True)),
    )
