"""BatchedDynamicEmbeddingTables: duplicates, empty bags and batches, eval mode,
safe-check, and bad input rejected before any table changes."""

import warnings

import pytest
import torch

from dynemb import (
    BatchedDynamicEmbeddingTables,
    DynamicEmbCheckMode,
    DynamicEmbInitializerArgs,
    DynamicEmbInitializerMode,
    DynamicEmbPoolingMode,
    DynamicEmbScoreStrategy,
    DynamicEmbTableOptions,
)
from dynemb.optimizer import EmbOptimType
from dynemb.tbe.lookup_function import readable_rows

DEBUG = DynamicEmbInitializerArgs(mode=DynamicEmbInitializerMode.DEBUG)


def make(pooling=DynamicEmbPoolingMode.SUM, capacity=1024, check=DynamicEmbCheckMode.IGNORE, **kw):
    opts = DynamicEmbTableOptions(
        dim=4, max_capacity=capacity, bucket_capacity=16, initializer_args=DEBUG, safe_check_mode=check,
        score_strategy=kw.pop("score_strategy", DynamicEmbScoreStrategy.TIMESTAMP),
    )  # fmt: skip
    return BatchedDynamicEmbeddingTables(
        [opts], feature_table_map=[0, 0], pooling_mode=pooling,
        optimizer=kw.pop("optimizer", EmbOptimType.EXACT_SGD), learning_rate=0.5, **kw,
    )  # fmt: skip


def snapshot(m):
    t = m.tables[0]
    k, v, s, _ = t.export_batch(0, t.capacity(), include_extra=True)
    order = torch.argsort(k)
    return k[order], v[order], s[order]


def test_duplicates_within_and_across_bags_get_one_update():
    m = make()
    # f0: [[5, 5], [6]]  f1: [[], [5]]   -> key 5 appears 3 times, key 6 once
    indices, offsets = torch.tensor([5, 5, 6, 5]), torch.tensor([0, 2, 3, 3, 4])
    out = m(indices, offsets)
    assert out.tolist() == [[10.0] * 4 + [0.0] * 4, [6.0] * 4 + [5.0] * 4]
    out.sum().backward()
    values, _ = m.tables[0].find(torch.tensor([5, 6]))
    assert values.tolist() == [[5.0 - 0.5 * 3] * 4, [6.0 - 0.5] * 4]
    assert m.tables[0].size() == 2


@pytest.mark.parametrize(
    "pooling",
    [DynamicEmbPoolingMode.SUM, DynamicEmbPoolingMode.MEAN, DynamicEmbPoolingMode.NONE],
)
@pytest.mark.parametrize("weighted", [False, True], ids=["plain", "weighted"])
def test_inputs_reused_between_forward_and_backward_change_nothing(pooling, weighted):
    """The forward does not copy the batch's keys (its backward does not read them): a
    caller refilling its input buffers before backward gets the same updates."""
    if weighted and pooling == DynamicEmbPoolingMode.NONE:
        pytest.skip("NONE pooling takes no per-sample weights")
    indices, offsets = torch.tensor([5, 5, 6, 5, 9]), torch.tensor([0, 2, 3, 3, 5])
    weights = torch.tensor([1.0, 0.5, 2.0, 1.5, -1.0]) if weighted else None
    plain, reused = (make(pooling, score_strategy=DynamicEmbScoreStrategy.STEP) for _ in "ab")
    grad = None
    for m in (plain, reused):
        w = None if weights is None else weights.clone()
        batch = (indices.clone(), offsets.clone(), w)
        out = m(*batch)
        if grad is None:
            grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(0))
        if m is reused:  # a reused input buffer, refilled before backward
            for x in batch:
                if x is not None:
                    x.fill_(3)
        out.backward(grad)
    for a, b in zip(snapshot(plain), snapshot(reused)):
        assert torch.equal(a, b)
    keys, values, _ = snapshot(plain)
    assert keys.tolist() == [5, 6, 9]  # DEBUG rows start as the key: they trained
    assert not torch.equal(values[:, :4], keys.float().unsqueeze(1).expand(-1, 4))


@pytest.mark.parametrize(
    "pooling",
    [DynamicEmbPoolingMode.SUM, DynamicEmbPoolingMode.MEAN, DynamicEmbPoolingMode.NONE],
)
def test_a_broadcast_gradient_trains_as_its_materialised_copy(pooling):
    """``loss = out.sum()`` sends an expanded scalar (strides (0, 0)): the backward reads
    one materialised row for every sample (readable_rows), with the same updates, to
    the bit, as the same gradient written out in full."""
    indices, offsets = torch.tensor([5, 5, 6, 5, 9]), torch.tensor([0, 2, 3, 3, 5])
    broadcast, dense = (make(pooling, score_strategy=DynamicEmbScoreStrategy.STEP) for _ in "ab")
    shape = make(pooling)(indices, offsets).shape
    expanded = torch.tensor(0.375).expand(shape)
    assert readable_rows(expanded).stride() == (0, 1)
    for m, grad in ((broadcast, expanded), (dense, torch.full(shape, 0.375))):
        m(indices, offsets).backward(grad)
    for a, b in zip(snapshot(broadcast), snapshot(dense)):
        assert torch.equal(a, b)
    keys, values, _ = snapshot(dense)
    assert not torch.equal(values[:, :4], keys.float().unsqueeze(1).expand(-1, 4))


def test_readable_rows_copies_only_what_the_ops_cannot_read():
    rows = torch.arange(12.0).view(3, 4)
    assert readable_rows(rows) is rows
    assert readable_rows(rows[:, 1:]).data_ptr() == rows[:, 1:].data_ptr()  # row-strided view
    transposed = rows.t()
    assert readable_rows(transposed).is_contiguous()
    assert torch.equal(readable_rows(transposed), transposed)
    one_row = readable_rows(torch.arange(4.0).expand(3, 4))  # strides (0, 1): read as is
    assert one_row.stride() == (0, 1)
    column = readable_rows(torch.arange(3.0).view(3, 1).expand(3, 4))  # strides (1, 0)
    assert column.is_contiguous() and torch.equal(column[:, 3], torch.arange(3.0))


@pytest.mark.parametrize("pooling", [DynamicEmbPoolingMode.SUM, DynamicEmbPoolingMode.MEAN])
def test_empty_bags_give_zero_rows(pooling):
    m = make(pooling)
    out = m(torch.tensor([1, 2]), torch.tensor([0, 0, 2, 2, 2]))
    assert out[0].tolist() == [0.0] * 8 and out[1, 4:].tolist() == [0.0] * 4
    assert out[1, :4].tolist() == [3.0 if pooling == DynamicEmbPoolingMode.SUM else 1.5] * 4


@pytest.mark.parametrize("pooling", list(DynamicEmbPoolingMode))
def test_empty_batch(pooling):
    m = make(pooling)
    for offsets in (torch.tensor([0]), torch.tensor([0, 0, 0, 0, 0])):
        out = m(torch.tensor([], dtype=torch.int64), offsets)
        assert out.shape == (
            (0, 4) if pooling == DynamicEmbPoolingMode.NONE else (offsets.numel() // 2, 8)
        )
        out.sum().backward()
    assert m.tables[0].size() == 0


def test_eval_mode_inserts_nothing_and_uses_the_eval_initializer():
    m = make()
    m(torch.tensor([1, 2]), torch.tensor([0, 1, 1, 2, 2])).sum().backward()
    before = snapshot(m)
    m.eval()
    out = m(torch.tensor([1, 77]), torch.tensor([0, 1, 2, 2, 2]))
    assert out[0, :4].tolist() == [1.0 - 0.5] * 4  # trained row
    assert out[1, :4].tolist() == [0.0] * 4  # unknown key: eval initializer (zeros)
    out.sum().backward()  # no update in eval mode
    after = snapshot(m)
    assert all(torch.equal(a, b) for a, b in zip(before, after))
    # A table with training=False behaves the same in train mode, with its eval initializer.
    opts = DynamicEmbTableOptions(
        dim=4, max_capacity=64, bucket_capacity=16, training=False,
        eval_initializer_args=DynamicEmbInitializerArgs(mode=DynamicEmbInitializerMode.CONSTANT, value=0.25),
    )  # fmt: skip
    frozen = BatchedDynamicEmbeddingTables([opts], [0], DynamicEmbPoolingMode.SUM)
    assert frozen(torch.tensor([3]), torch.tensor([0, 1])).tolist() == [[0.25] * 4]
    assert frozen.tables[0].size() == 0


def overfull():
    """A 16-slot table and 40 keys that all want to stay (NO_EVICTION): 24 cannot be stored."""
    return torch.arange(1000, 1040), torch.tensor([0, 40, 40])


def test_safe_check_error_names_the_table_and_count():
    m = make(
        capacity=16,
        check=DynamicEmbCheckMode.ERROR,
        score_strategy=DynamicEmbScoreStrategy.NO_EVICTION,
    )
    with pytest.raises(RuntimeError, match=r"'table_0': 24 keys could not be stored"):
        m(*overfull())
    assert m.safe_check_failures == [24]


def test_safe_check_warning_warns_and_uses_zero_rows():
    m = make(
        capacity=16,
        check=DynamicEmbCheckMode.WARNING,
        score_strategy=DynamicEmbScoreStrategy.NO_EVICTION,
    )
    indices, offsets = overfull()
    with pytest.warns(UserWarning, match="24 keys could not be stored"):
        out = m(indices, offsets)
    stored = m.tables[0].contains(indices)
    assert int(stored.sum()) == 16
    assert out[0, :4].tolist() == [float(indices[stored].sum())] * 4  # failed keys add zeros
    out.sum().backward()  # failed keys are skipped by the update
    assert m.tables[0].size() == 16


def test_safe_check_ignore_is_silent_and_counted():
    m = make(
        capacity=16,
        check=DynamicEmbCheckMode.IGNORE,
        score_strategy=DynamicEmbScoreStrategy.NO_EVICTION,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        m(*overfull())
    assert m.safe_check_failures == [24]


@pytest.mark.parametrize(
    "indices, offsets, weights, exc, match",
    [
        (torch.tensor([1.0]), torch.tensor([0, 1, 1]), None, TypeError, "indices must be an int64"),
        (
            torch.tensor([1]),
            torch.tensor([0.0, 1.0, 1.0]),
            None,
            TypeError,
            "offsets must be an int64",
        ),
        (
            torch.tensor([1, 2]),
            torch.tensor([0, 1, 1]),
            None,
            ValueError,
            r"offsets must end at len\(indices\)=2",
        ),
        (
            torch.tensor([1, 2]),
            torch.tensor([0, 2, 1, 2, 2]),
            None,
            ValueError,
            "bag 1 has length -1",
        ),
        (
            torch.tensor([1]),
            torch.tensor([0, 1]),
            None,
            ValueError,
            "B \\* T \\+ 1 entries with T=2",
        ),
        (torch.tensor([1]), torch.tensor([1, 1, 1]), None, ValueError, "offsets must start at 0"),
        # One entry (no bag): offsets=[5] claimed 5 indices and was accepted.
        (
            torch.tensor([], dtype=torch.int64),
            torch.tensor([5]),
            None,
            ValueError,
            r"offsets must start at 0, got offsets\[0\]=5",
        ),
        (
            torch.tensor([7]),
            torch.tensor([0]),
            None,
            ValueError,
            r"offsets must end at len\(indices\)=1, got 0",
        ),
        (
            torch.tensor([1]),
            torch.tensor([0, 1, 1]),
            torch.tensor([1.0, 2.0]),
            ValueError,
            "per_sample_weights must have shape",
        ),
        (torch.tensor([[1]]), torch.tensor([0, 1, 1]), None, ValueError, "must be 1-D"),
    ],
)
def test_bad_input_raises_before_any_table_changes(indices, offsets, weights, exc, match):
    m = make()
    m(torch.tensor([1, 2]), torch.tensor([0, 1, 1, 2, 2])).sum().backward()
    before = snapshot(m)
    with pytest.raises(exc, match=match):
        m(indices, offsets, weights)
    assert all(torch.equal(a, b) for a, b in zip(before, snapshot(m)))


def test_bad_constructor_arguments():
    opts = DynamicEmbTableOptions(dim=4, max_capacity=64)
    with pytest.raises(ValueError, match="feature_table_map"):
        BatchedDynamicEmbeddingTables([opts], [1])
    with pytest.raises(ValueError, match="dim must be a positive int"):
        BatchedDynamicEmbeddingTables([DynamicEmbTableOptions(max_capacity=64)], [0])
    with pytest.raises(ValueError, match="optimizer must be one of"):
        BatchedDynamicEmbeddingTables([opts], [0], optimizer=EmbOptimType.LAMB)
    with pytest.raises(ValueError, match="pooling_mode NONE needs one dim"):
        BatchedDynamicEmbeddingTables(
            [opts, DynamicEmbTableOptions(dim=8, max_capacity=64)],
            [0, 1],
            DynamicEmbPoolingMode.NONE,
        )


def test_customized_tables_train_with_the_score_set_by_set_score():
    from dynemb.incremental_dump import set_score

    module = BatchedDynamicEmbeddingTables(
        [
            DynamicEmbTableOptions(
                dim=4, max_capacity=256, score_strategy=DynamicEmbScoreStrategy.CUSTOMIZED
            )
        ],
        [0],
        table_names=["t"],
    )
    keys = torch.tensor([5, 6, 5])
    offsets = torch.tensor([0, 1, 3])
    set_score(module, {"model": {"t": 7}})
    module(keys, offsets).sum().backward()
    assert module.tables[0].get_scores(torch.tensor([5, 6])).tolist() == [7, 7]
    set_score(module, {"model": {"t": 9}})
    module(torch.tensor([6]), torch.tensor([0, 1])).sum().backward()
    assert module.tables[0].get_scores(torch.tensor([5, 6])).tolist() == [7, 9]
