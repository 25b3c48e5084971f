"""Pooled bags written to, and gradients read from, a module's output columns in place
(core/pooling.h BagRows; ops embedding_pool_into and embedding_backward(columns=)).

The in-place forms give the same bits as the dense forms plus a copy (forward) or a
concatenation (backward), on both op libraries; bad placements are refused before
anything is written; and a BatchedDynamicEmbeddingTables step issues no per-table
copy or concatenation for pooled lookups.
"""

import dynemb._C  # noqa: F401  (loads both op libraries)
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from dynemb import DynamicEmbPoolingMode, DynamicEmbTableOptions, EmbOptimType
from dynemb.tbe.batched_dynamic_embedding_tables import BatchedDynamicEmbeddingTables

LIBRARIES = {"cpu": torch.ops.dynemb, "cuda-emulated": torch.ops.dynemb_cuda_emulated}
DIM, ROW, SLOTS, B = 4, 5, 64, 50
UNIFORM = [2.0, -0.5, 0.5, 0.0, 0.0, 0.0, 0.0]
ADAGRAD = [2.0, 0.1, 1e-8, 0.9, 0.99, 0.0]  # EXACT_ROWWISE_ADAGRAD: 1 state column


def _table():
    g = torch.Generator().manual_seed(3)
    return [
        torch.zeros(4, 16, dtype=torch.uint8),
        torch.zeros(SLOTS, dtype=torch.int64),
        torch.zeros(SLOTS, dtype=torch.int64),
        torch.zeros(0, dtype=torch.int64),
        torch.rand(SLOTS, ROW, generator=g),
        torch.zeros(4, dtype=torch.int32),
        torch.zeros(4, dtype=torch.uint8),
        torch.zeros(0, ROW),
        torch.zeros(0, dtype=torch.int32),  # pins: none (no upserts here)
    ]


def _bags(features):
    """features * B feature-major bags: slots (some -1), keys, offsets, weights."""
    g = torch.Generator().manual_seed(features)
    lengths = torch.randint(0, 4, (features * B,), generator=g)
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])
    n = int(offsets[-1])
    slots = torch.randint(-1, SLOTS, (n,), generator=g)
    return slots, torch.randint(0, 1000, (n,), generator=g), offsets, torch.rand(n, generator=g)


@pytest.mark.parametrize("library", list(LIBRARIES))
@pytest.mark.parametrize("mode", [0, 1], ids=["sum", "mean"])
def test_pool_into_writes_each_feature_in_its_columns_only(library, mode):
    lib = LIBRARIES[library]
    slots, keys, offsets, weights = _bags(2)
    table = _table()
    dense = lib.embedding_pool(table, slots, keys, offsets, weights, mode, UNIFORM, 1, DIM)
    wide = torch.full((B, 16), 7.0)
    columns = torch.tensor([9, 2])  # features in any column order, with gaps
    lib.embedding_pool_into(
        table, slots, keys, offsets, weights, mode, UNIFORM, 1, DIM, wide, columns
    )
    expected = torch.full((B, 16), 7.0)
    expected[:, 9:13] = dense[:B]
    expected[:, 2:6] = dense[B:]
    assert torch.equal(wide, expected)
    view = torch.full((B, 20), 7.0)[:, 3:19]  # a column slice: row stride 20
    lib.embedding_pool_into(
        table, slots, keys, offsets, weights, mode, UNIFORM, 1, DIM, view, columns
    )
    assert torch.equal(view, expected)


@pytest.mark.parametrize("library", list(LIBRARIES))
@pytest.mark.parametrize("mode", [0, 1], ids=["sum", "mean"])
def test_backward_reads_each_feature_from_its_columns(library, mode):
    lib = LIBRARIES[library]
    slots, keys, offsets, weights = _bags(2)
    unique_slots = torch.arange(-1, SLOTS)  # inverse: index of each index's slot
    inverse = slots + 1
    grad_out = torch.randn(B, 16, generator=torch.Generator().manual_seed(4))
    columns = torch.tensor([9, 2])
    dense_table, strided_table = _table(), _table()
    dense = torch.cat([grad_out[:, 9:13], grad_out[:, 2:6]])
    lib.embedding_backward(
        dense_table, unique_slots, inverse, offsets, weights, mode, dense, ADAGRAD, 1, DIM
    )
    lib.embedding_backward(
        strided_table, unique_slots, inverse, offsets, weights, mode, grad_out, ADAGRAD, 1,
        DIM, columns,
    )  # fmt: skip
    assert not torch.equal(dense_table[4], _table()[4])
    assert torch.equal(strided_table[4], dense_table[4])


def _pool_into(lib, table, out, columns):
    slots, keys, offsets, weights = _bags(2)
    lib.embedding_pool_into(table, slots, keys, offsets, weights, 0, UNIFORM, 1, DIM, out, columns)


def _backward(lib, table, grad, columns):
    slots, keys, offsets, weights = _bags(2)
    lib.embedding_backward(
        table, torch.arange(-1, SLOTS), slots + 1, offsets, weights, 0, grad, ADAGRAD, 1, DIM,
        columns,
    )  # fmt: skip


BAD = [
    (torch.zeros(B, 8), torch.tensor([0, 5]), r"`columns` must hold column offsets in \[0, 5\)"),
    (torch.zeros(B, 8), torch.tensor([-1, 4]), r"`columns` must hold column offsets in \[0, 5\)"),
    (torch.zeros(B, 8), torch.tensor([0]), r"`columns` \(1 features\) and `\w+` \(50 rows\)"),
    (torch.zeros(B + 1, 8), torch.tensor([0, 4]), r"\(51 rows\) must give one place per bag"),
    (torch.zeros(B, 8, dtype=torch.float64), torch.tensor([0, 4]), "must be float32"),
    (torch.zeros(8, B).t(), torch.tensor([0, 4]), "must be 2-D with contiguous rows"),
    (torch.zeros(B, 8), torch.tensor([0.0, 4.0]), "`columns` must have dtype"),
]


@pytest.mark.parametrize("library", list(LIBRARIES))
@pytest.mark.parametrize("call", [_pool_into, _backward], ids=["pool_into", "backward"])
@pytest.mark.parametrize("matrix, columns, match", BAD)
def test_bad_placement_is_refused_before_any_write(library, call, matrix, columns, match):
    table = _table()
    before, matrix_before = [t.clone() for t in table], matrix.clone()
    with pytest.raises((ValueError, TypeError), match=match):
        call(LIBRARIES[library], table, matrix, columns)
    assert all(torch.equal(t, b) for t, b in zip(table, before))
    assert torch.equal(matrix, matrix_before)


class _FloatCopies(TorchDispatchMode):
    """Counts aten copy_ / cat calls on float32 tensors (embedding rows and gradients;
    the tables' own bookkeeping copies int64 slots and keys)."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func.overloadpacket.__name__ in ("copy_", "cat") and out.dtype == torch.float32:
            self.count += 1
        return out


def test_pooled_step_has_no_per_table_output_copies_or_gradient_concatenations():
    num_tables = 8
    module = BatchedDynamicEmbeddingTables(
        [DynamicEmbTableOptions(dim=DIM, max_capacity=256) for _ in range(num_tables)],
        feature_table_map=list(range(num_tables)) + [0],  # table 0 serves two features
        pooling_mode=DynamicEmbPoolingMode.SUM,
        optimizer=EmbOptimType.EXACT_ROWWISE_ADAGRAD,
    )
    features = num_tables + 1
    offsets = torch.arange(0, 2 * features * 8 + 1, 2)  # B = 8, 2 indices a bag
    g = torch.Generator().manual_seed(1)
    indices = torch.randint(0, 100, (int(offsets[-1]),), generator=g)
    with _FloatCopies() as forward:
        out = module(indices, offsets)
    loss = out.square().sum()
    with _FloatCopies() as backward:
        loss.backward()
    assert (forward.count, backward.count) == (0, 0)
