"""Bad arguments raise TypeError / ValueError naming the problem, before anything changes."""

import pytest
import torch

import dynemb
from dynemb import DynamicEmbInitializerArgs, DynamicEmbInitializerMode
from dynemb import DynamicEmbScoreStrategy as S


@pytest.mark.parametrize(
    "kwargs, exc, match",
    [
        (dict(bucket_capacity=100), ValueError, "bucket_capacity must be a multiple of 16"),
        (dict(bucket_capacity=0), ValueError, "bucket_capacity must be >= 16"),
        (
            dict(capacity=64, bucket_capacity=128),
            ValueError,
            "capacity must be >= bucket_capacity=128",
        ),
        (dict(init_capacity=10**6), ValueError, "init_capacity=1000000 exceeds capacity"),
        (dict(dim=0), ValueError, "dim must be >= 1"),
        (dict(dim=2.5), TypeError, "dim must be an int"),
        (dict(extra_columns=-1), ValueError, "extra_columns must be >= 0"),
        (dict(value_dtype=torch.float64), TypeError, "value_dtype must be one of"),
        (dict(score_strategy=(S.STEP, S.LFU)), ValueError, "score_strategy must be"),
        (dict(score_strategy="lru"), ValueError, "score_strategy must be"),
        (
            dict(initializer=DynamicEmbInitializerArgs(lower=1.0, upper=0.0)),
            ValueError,
            "lower < upper",
        ),
        (
            dict(
                initializer=DynamicEmbInitializerArgs(
                    mode=DynamicEmbInitializerMode.NORMAL, std_dev=0
                )
            ),
            ValueError,
            "std_dev must be > 0",
        ),
        (dict(initializer="uniform"), TypeError, "initializer must be"),
        (dict(seed=2**64), ValueError, "seed must be an int64"),
        (dict(extra_init=float("nan")), ValueError, "extra_init must be a finite number.*got nan"),
        (dict(extra_init=1e39), ValueError, "extra_init must be .*float32.*got 1e\\+39"),
        (dict(capacity=2**64), ValueError, f"capacity={2**64} is too large"),
        # 2**59 slots of 4 float32 columns + key, score, digest: 2**59 * 33 bytes > int64.
        (dict(capacity=2**59), ValueError, f"capacity={2**59} is too large"),
    ],
)
def test_bad_constructor_arguments(kwargs, exc, match):
    args = dict(dim=4, capacity=1024) | kwargs
    with pytest.raises(exc, match=match):
        dynemb.ScoredHashTable(**args)


INF, NAN = float("inf"), float("nan")
U, N, TN, C = (
    DynamicEmbInitializerMode.UNIFORM,
    DynamicEmbInitializerMode.NORMAL,
    DynamicEmbInitializerMode.TRUNCATED_NORMAL,
    DynamicEmbInitializerMode.CONSTANT,
)


@pytest.mark.parametrize(
    "fields, match",
    [
        (dict(mode=U, lower=-INF, upper=1.0), "lower must be a finite number.*got -inf"),
        (dict(mode=U, lower=0.0, upper=INF), "upper must be a finite number.*got inf"),
        (dict(mode=U, lower=NAN, upper=1.0), "lower must be a finite number.*got nan"),
        (dict(mode=U, lower=-1e39, upper=1.0), "lower must be .*float32.*got -1e\\+39"),
        (dict(mode=N, mean=INF), "mean must be a finite number.*got inf"),
        (dict(mode=N, std_dev=NAN), "std_dev must be a finite number.*got nan"),
        (dict(mode=N, std_dev=1e300), "std_dev must be .*float32"),
        (dict(mode=TN, lower=-1.0, upper=INF), "upper must be a finite number"),
        (dict(mode=TN, mean=3e38, std_dev=1e38), "upper cut \\(mean \\+ 2 \\* std_dev\\)"),
        (dict(mode=C, value=INF), "value must be a finite number.*got inf"),
        (dict(mode=C, value=-1e300), "value must be .*float32"),
        (dict(mode=C, value=10**400), "value must be .*float32"),
    ],
)
def test_initializer_arguments_must_be_float32_numbers(fields, match):
    """Infinite, NaN or too large bounds would give NaN rows: refused, naming the field."""
    with pytest.raises(ValueError, match="DynamicEmbInitializerArgs." + match):
        dynemb.ScoredHashTable(
            dim=4, capacity=1024, initializer=DynamicEmbInitializerArgs(**fields)
        )
    opts = dynemb.DynamicEmbTableOptions(
        dim=4, max_capacity=1024, initializer_args=DynamicEmbInitializerArgs(**fields)
    )
    with pytest.raises(ValueError, match="DynamicEmbInitializerArgs." + match):
        dynemb.BatchedDynamicEmbeddingTables([opts], [0])


@pytest.mark.parametrize(
    "capacity, match",
    [
        (2**64, "table 'table_0': max_capacity must be an int in \\[1, 2\\*\\*63 - 1\\]"),
        (2**60, f"capacity={2**60} is too large"),  # its bytes do not fit in int64
    ],
)
def test_a_kernel_table_too_large_for_int64_is_refused(capacity, match):
    opts = dynemb.DynamicEmbTableOptions(dim=4, max_capacity=capacity, init_capacity=1024)
    with pytest.raises(ValueError, match=match):
        dynemb.BatchedDynamicEmbeddingTables([opts], [0])


def test_largest_float32_bounds_are_accepted():
    big = float(torch.finfo(torch.float32).max)
    init = DynamicEmbInitializerArgs(mode=C, value=-big)
    t = dynemb.ScoredHashTable(dim=4, capacity=1024, initializer=init, extra_init=big)
    assert torch.equal(t.find_or_insert(KEYS), torch.full((3, 4), -big))


def _snapshot(t):
    k, v, s, _ = t.export_batch(0, t.capacity(), include_extra=True)
    order = torch.argsort(k)
    return k[order], v[order], s[order], t.size()


def _assert_unchanged(t, before):
    after = _snapshot(t)
    for a, b in zip(before[:3], after[:3]):
        assert torch.equal(a, b)
    assert before[3] == after[3]


KEYS = torch.tensor([1, 2, 3])


@pytest.mark.parametrize(
    "call, exc, match",
    [
        (lambda t: t.find_or_insert(KEYS.int()), TypeError, "keys must have dtype torch.int64"),
        (lambda t: t.find_or_insert(KEYS.view(3, 1)), ValueError, "keys must be 1-D"),
        (lambda t: t.find_or_insert([1, 2]), TypeError, "keys must be a torch.Tensor"),
        (
            lambda t: t.find_or_insert(KEYS, torch.tensor([1, 2, 3])),
            ValueError,
            "scores are accepted only under CUSTOMIZED",
        ),
        (
            lambda t: t.insert_or_assign(KEYS, torch.zeros(3, 5)),
            ValueError,
            r"values must have shape \(3, 4\)",
        ),
        (
            lambda t: t.insert_or_assign(KEYS, torch.zeros(2, 4)),
            ValueError,
            "values must have shape",
        ),
        (
            lambda t: t.insert_or_assign(KEYS, torch.zeros(3, 4, dtype=torch.int64)),
            TypeError,
            "values must be a floating-point tensor",
        ),
        (
            lambda t: t.insert_and_evict(KEYS.float(), torch.zeros(3, 4)),
            TypeError,
            "keys must have dtype",
        ),
        (lambda t: t.erase(KEYS.view(1, 3)), ValueError, "keys must be 1-D"),
        (lambda t: t.export_batch(-1, 10), ValueError, "offset must be an int in"),
        (lambda t: t.export_batch(0, 0), ValueError, "n must be >= 1"),
    ],
)
def test_bad_call_arguments_leave_the_table_unchanged(call, exc, match):
    t = dynemb.ScoredHashTable(dim=4, capacity=1024, score_strategy=S.LFU)
    t.find_or_insert(torch.arange(100))
    before = _snapshot(t)
    with pytest.raises(exc, match=match):
        call(t)
    _assert_unchanged(t, before)


@pytest.mark.parametrize(
    "scores, exc, match",
    [
        (None, ValueError, "scores are required"),
        (torch.tensor([1.0, 2.0, 3.0]), TypeError, "scores must be an int64 tensor"),
        (torch.tensor([1, 2]), ValueError, r"scores must have shape \(3,\)"),
        (torch.tensor([1, -2, 3]), ValueError, "scores must be >= 0"),
    ],
)
def test_customized_scores_are_checked(scores, exc, match):
    t = dynemb.ScoredHashTable(dim=4, capacity=1024, score_strategy=S.CUSTOMIZED)
    t.find_or_insert(torch.arange(10), torch.arange(10))
    before = _snapshot(t)
    with pytest.raises(exc, match=match):
        t.find_or_insert(KEYS, scores)
    _assert_unchanged(t, before)


@pytest.mark.parametrize(
    "strategy, meta, match",
    [
        (S.LFU, dict(scores=torch.tensor([1, -1, 3])), "scores must be >= 0, got -1 for key 2"),
        (S.CUSTOMIZED, dict(scores=torch.tensor([-5, 1, 3])), "scores must be >= 0, got -5"),
        (
            (S.TIMESTAMP, S.LFU),
            dict(scores=torch.tensor([1, 2, 3]), timestamps=torch.tensor([1, 2, -(2**63)])),
            f"timestamps must be >= 0, got {-(2**63)} for key 3",
        ),
    ],
)
def test_restore_refuses_negative_scores_and_timestamps(strategy, meta, match):
    """A negative saved score was stored (as a huge uint64 it outranked every key)."""
    t = dynemb.ScoredHashTable(dim=4, capacity=1024, score_strategy=strategy)
    t.restore(torch.tensor([2, 9]), torch.ones(2, 4), scores=torch.tensor([4, 5]))
    before = _snapshot(t)
    with pytest.raises(ValueError, match=match):
        t.restore(KEYS, torch.zeros(3, 4), **meta)
    _assert_unchanged(t, before)


def test_timestamps_need_the_compound_strategy():
    t = dynemb.ScoredHashTable(dim=4, capacity=1024, score_strategy=S.LFU)
    with pytest.raises(ValueError, match="TIMESTAMP, LFU"):
        t.get_timestamps(KEYS)


def test_op_level_checks_name_the_argument():
    """The C++ ops check too (for callers that bypass the Python face)."""
    from dynemb import _ops

    t = dynemb.ScoredHashTable(dim=4, capacity=1024)
    with pytest.raises(ValueError, match="`values` must be a contiguous"):
        _ops.table_find(t.buffers.tensors(), KEYS, torch.zeros(2, 4))
    with pytest.raises(TypeError, match="`keys` must have dtype Long"):
        _ops.table_find_slots(t.buffers.tensors(), KEYS.int())
    with pytest.raises(ValueError, match="`table` must hold 9 tensors"):
        _ops.table_erase(t.buffers.tensors()[:3], KEYS)


def test_find_into_out():
    t = dynemb.ScoredHashTable(dim=4, capacity=1024)
    rows = t.find_or_insert(torch.arange(3))
    out = torch.full((4, 4), 7.0)
    values, found = t.find(torch.tensor([0, 1, 2, 99]), out=out)
    assert values is out and found.tolist() == [True, True, True, False]
    assert torch.equal(out[:3], rows) and out[3].tolist() == [0.0] * 4
    with pytest.raises(
        ValueError, match=r"out must be a contiguous torch.float32 tensor of shape \(4, 4\)"
    ):
        t.find(torch.tensor([0, 1, 2, 99]), out=torch.zeros(4, 3))
