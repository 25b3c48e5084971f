"""The grouped embedding ops (unique_keys_grouped, embedding_pool_into_grouped,
embedding_backward_grouped; core/grouped.h; the lookup's is in test_grouped_lookup.py):
every table of a batch in one executor call gives the same bits as one
per-table op call each (the oracle), on both op libraries; bad arguments are refused,
naming the table, before anything is written; and a module step makes one grouped call
per phase whatever the number of tables.
"""

import dynemb._C  # noqa: F401  (loads both op libraries)
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from dynemb import DynamicEmbPoolingMode, DynamicEmbTableOptions, EmbOptimType, _ops
from dynemb.tbe.batched_dynamic_embedding_tables import BatchedDynamicEmbeddingTables

LIBRARIES = {"cpu": torch.ops.dynemb, "cuda-emulated": torch.ops.dynemb_cuda_emulated}
B = 40
UNIFORM = [2.0, -0.5, 0.5, 0.0, 0.0, 0.0, 0.0, 0.0]
# (dim, features) per table; the third table's bags are all empty.
TABLES = [(4, 2), (8, 1), (3, 3), (16, 1)]
WIDTH = sum(d * k for d, k in TABLES)


def _table(t, dim, dtype=torch.float32):
    g = torch.Generator().manual_seed(10 + t)
    slots, row = 64, 3 * dim  # room for every optimizer's state (Adam: 2 * dim)
    return [
        torch.zeros(4, 16, dtype=torch.uint8),
        torch.zeros(slots, dtype=torch.int64),
        torch.zeros(slots, dtype=torch.int64),
        torch.zeros(0, dtype=torch.int64),
        torch.rand(slots, row, generator=g).to(dtype),
        torch.zeros(4, dtype=torch.int32),
        torch.zeros(4, dtype=torch.uint8),
        torch.zeros(0, row, dtype=dtype),
        torch.zeros(0, dtype=torch.int32),  # pins: none (no upserts here)
    ]


def _batch(t, features, empty=False):
    """A table's share: slots (some -1), keys, offsets, weights, unique_slots, inverse."""
    g = torch.Generator().manual_seed(t)
    lengths = torch.randint(0, 4, (features * B,), generator=g) * (0 if empty else 1)
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])
    n = int(offsets[-1])
    unique_slots = torch.randperm(64, generator=g)[:20] - 1  # distinct, one may be -1
    inverse = torch.randint(0, 20, (n,), generator=g)
    keys = torch.randint(0, 1000, (n,), generator=g)
    return unique_slots[inverse], keys, offsets, torch.rand(n, generator=g), unique_slots, inverse


def _columns():
    cols, start = [], 0
    for dim, k in TABLES:
        cols.append(torch.arange(k, dtype=torch.int64) * dim + start)
        start += dim * k
    return cols


def _setup(dtype=torch.float32):
    tables = [_table(t, d, dtype) for t, (d, _) in enumerate(TABLES)]
    batches = [_batch(t, k, empty=t == 2) for t, (_, k) in enumerate(TABLES)]
    return tables, batches


@pytest.mark.parametrize("library", list(LIBRARIES))
@pytest.mark.parametrize("mode", [0, 1], ids=["sum", "mean"])
@pytest.mark.parametrize("weighted", [False, True], ids=["plain", "weighted"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("by_key", [False, True], ids=["slot-per-index", "slot-per-key"])
def test_grouped_pool_is_the_per_table_pool(library, mode, weighted, dtype, by_key):
    """by_key: the grouped call gets each table's unique_slots and inverse instead of a
    slot per index (the per-table oracle always gets unique_slots[inverse])."""
    lib = LIBRARIES[library]
    tables, batches = _setup(dtype)
    columns, dims = _columns(), [d for d, _ in TABLES]
    expected = torch.full((B, WIDTH + 3), 7.0)[:, 1 : WIDTH + 1]  # strided rows
    got = expected.clone()
    for t, (slots, keys, offsets, weights, *_) in enumerate(batches):
        lib.embedding_pool_into(
            tables[t], slots, keys, offsets, weights if weighted else None, mode, UNIFORM,
            t, dims[t], expected, columns[t],
        )  # fmt: skip
    slots = [b[4] for b in batches] if by_key else [b[0] for b in batches]
    inverse = [b[5] for b in batches] if by_key else []
    lib.embedding_pool_into_grouped(
        [x for table in tables for x in table], slots, inverse, [b[1] for b in batches],
        [b[2] for b in batches], [b[3] for b in batches] if weighted else [], mode,
        UNIFORM * len(TABLES), list(range(len(TABLES))), dims, got, columns,
    )  # fmt: skip
    assert torch.equal(got, expected)
    assert not torch.equal(got[:, :4], torch.full((B, 4), 7.0))  # it wrote


@pytest.mark.parametrize("library", list(LIBRARIES))
@pytest.mark.parametrize("optimizer", [0, 1, 2, 3], ids=["sgd", "adagrad", "rowwise", "adam"])
@pytest.mark.parametrize("mode, weighted", [(0, False), (1, True)], ids=["sum", "mean-weighted"])
def test_grouped_backward_is_the_per_table_backward(library, optimizer, mode, weighted):
    lib = LIBRARIES[library]
    opt = [float(optimizer), 0.1, 1e-8, 0.9, 0.99, 0.01]
    expected_tables, batches = _setup()
    got_tables = [[x.clone() for x in table] for table in expected_tables]
    columns, dims = _columns(), [d for d, _ in TABLES]
    grad = torch.randn(B, WIDTH + 2, generator=torch.Generator().manual_seed(5))[:, 2:]
    for t, (_, _, offsets, weights, unique_slots, inverse) in enumerate(batches):
        lib.embedding_backward(
            expected_tables[t], unique_slots, inverse, offsets, weights if weighted else None,
            mode, grad, opt, 3, dims[t], columns[t],
        )  # fmt: skip
    lib.embedding_backward_grouped(
        [x for table in got_tables for x in table], [b[4] for b in batches],
        [b[5] for b in batches], [b[2] for b in batches],
        [b[3] for b in batches] if weighted else [], mode, grad, opt, 3, dims, columns,
    )  # fmt: skip
    for t in range(len(TABLES)):
        assert torch.equal(got_tables[t][4], expected_tables[t][4]), f"table {t}"
    assert not torch.equal(got_tables[0][4], _table(0, dims[0])[4])  # it updated


def _grouped_backward(lib, table_list, batches, **changes):
    args = dict(
        tables=[x for table in table_list for x in table], unique_slots=[b[4] for b in batches],
        inverse=[b[5] for b in batches], offsets=[b[2] for b in batches], weights=[], mode=0,
        grad=torch.ones(B, WIDTH), optimizer=[0.0, 0.1, 1e-8, 0.9, 0.99, 0.0], step=1,
        dims=[d for d, _ in TABLES], columns=_columns(),
    )  # fmt: skip
    args.update(changes)
    lib.embedding_backward_grouped(*args.values())


def _bad_backward_cases(tables, batches):
    n = len(TABLES)
    return [
        (dict(inverse=[b[5] for b in batches][:-1]), r"`inverse` must hold 4 entries for 4 tables"),
        (dict(tables=[x for tb in tables for x in tb][:-1]), r"`tables` must hold 36 entries"),
        (dict(weights=[torch.ones(1)]), r"`weights` must hold no tensor or one per table"),
        (dict(dims=[4, 8, 3, 99]), r"embedding_backward_grouped, table 3: `dim` 99"),
        (dict(columns=_columns()[:3] + [torch.tensor([WIDTH])]),
         r"table 3: `columns` must hold column offsets"),
        (dict(tables=[x for tb in [tables[0]] * n for x in tb], dims=[4] * n,
              columns=[_columns()[0][:1]] * n, unique_slots=[batches[1][4]] * n,
              inverse=[batches[1][5]] * n, offsets=[batches[1][2]] * n),
         r"tables 0 and 1 are the same table"),
        (dict(unique_slots=[], inverse=[], offsets=[], dims=[], columns=[], tables=[]),
         "needs at least one table"),
    ]  # fmt: skip


@pytest.mark.parametrize("library", list(LIBRARIES))
@pytest.mark.parametrize("case", range(7))
def test_bad_grouped_backward_changes_nothing(library, case):
    tables, batches = _setup()
    before = [[x.clone() for x in table] for table in tables]
    changes, match = _bad_backward_cases(tables, batches)[case]
    with pytest.raises((ValueError, TypeError), match=match):
        _grouped_backward(LIBRARIES[library], tables, batches, **changes)
    assert all(torch.equal(x, y) for a, b in zip(tables, before) for x, y in zip(a, b))


@pytest.mark.parametrize("library", list(LIBRARIES))
def test_grouped_pool_refuses_mixed_dtypes_and_bad_tables_before_writing(library):
    lib = LIBRARIES[library]
    tables, batches = _setup()
    tables[1] = _table(1, TABLES[1][0], torch.bfloat16)
    out = torch.zeros(B, WIDTH)

    def call(**changes):
        args = dict(
            tables=[x for table in tables for x in table], slots=[b[0] for b in batches],
            inverse=[], keys=[b[1] for b in batches], offsets=[b[2] for b in batches], weights=[], mode=0,
            missing=UNIFORM * len(TABLES), seeds=[0] * len(TABLES),
            dims=[d for d, _ in TABLES], out=out, columns=_columns(),
        )  # fmt: skip
        args.update(changes)
        lib.embedding_pool_into_grouped(*args.values())

    with pytest.raises(TypeError, match=r"value dtype of table 0 \(Float\), table 1 has BFloat16"):
        call()
    tables[1] = _table(1, TABLES[1][0])
    bad_slots = [b[0] for b in batches]
    bad_slots[3] = bad_slots[3].clone()
    bad_slots[3][0] = 64
    with pytest.raises(ValueError, match=r"embedding_pool_into_grouped, table 3: `slots` must"):
        call(slots=bad_slots)
    with pytest.raises(ValueError, match=r"`missing` must hold 32 entries for 4 tables"):
        call(missing=UNIFORM)
    by_key = {"slots": [b[4] for b in batches], "inverse": [b[5] for b in batches]}
    call(**by_key, out=torch.zeros(B, WIDTH))  # well formed: accepted
    bad_inverse = [x.clone() for x in by_key["inverse"]]
    bad_inverse[3][-1] = 20  # table 3 has 20 distinct keys
    with pytest.raises(ValueError, match=r"table 3: `inverse` must hold ids in \[0, 20\), got"):
        call(slots=by_key["slots"], inverse=bad_inverse)
    with pytest.raises(ValueError, match=r"`inverse` must hold no tensor or one per table \(4\)"):
        call(slots=by_key["slots"], inverse=by_key["inverse"][:3])
    bad_unique = [x.clone() for x in by_key["slots"]]
    bad_unique[1][0] = 64
    with pytest.raises(ValueError, match=r"table 1: `slots` must hold slots in \[-1, 64\)"):
        call(slots=bad_unique, inverse=by_key["inverse"])
    assert torch.equal(out, torch.zeros(B, WIDTH))


@pytest.mark.parametrize("library", list(LIBRARIES))
def test_grouped_dedup_is_the_per_table_dedup(library):
    lib = LIBRARIES[library]
    g = torch.Generator().manual_seed(2)
    keys = [
        torch.randint(0, 50, (300,), generator=g),
        torch.zeros(0, dtype=torch.int64),  # an empty table's keys
        torch.randint(-(2**62), 2**62, (40,), generator=g).repeat(3),
        torch.tensor([7]),
        torch.zeros(0, dtype=torch.int64),
    ]
    unique, inverse, counts = lib.unique_keys_grouped(keys)
    assert len(unique) == len(inverse) == len(counts) == len(keys)
    for t, k in enumerate(keys):
        expected = lib.unique_keys(k)
        for got, want in zip((unique[t], inverse[t], counts[t]), expected):
            assert torch.equal(got, want), f"table {t}"
    assert unique[0].numel() == 50 and unique[2].numel() == 40


@pytest.mark.parametrize("library", list(LIBRARIES))
def test_grouped_dedup_refuses_bad_keys(library):
    lib = LIBRARIES[library]
    with pytest.raises(TypeError, match=r"unique_keys_grouped, table 1: `keys` must have dtype"):
        lib.unique_keys_grouped([torch.tensor([1]), torch.tensor([1], dtype=torch.int32)])
    with pytest.raises(ValueError, match="needs at least one keys tensor"):
        _ops.unique_keys_grouped([])


class _OpCalls(TorchDispatchMode):
    """Counts the dynemb op calls of a step by name."""

    def __init__(self):
        super().__init__()
        self.calls = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        self.calls[name] = self.calls.get(name, 0) + 1
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("num_tables", [3, 12])
def test_a_module_step_makes_one_call_per_phase(num_tables):
    """Tables of two dims, one absent (no feature): one grouped call per phase."""
    options = [
        DynamicEmbTableOptions(dim=4 + 4 * (t % 2), max_capacity=256) for t in range(num_tables)
    ]
    fmap = [t for t in range(num_tables) if t != 1]
    module = BatchedDynamicEmbeddingTables(
        options, feature_table_map=fmap, pooling_mode=DynamicEmbPoolingMode.SUM,
        optimizer=EmbOptimType.EXACT_ROWWISE_ADAGRAD,
    )  # fmt: skip
    g = torch.Generator().manual_seed(1)
    lengths = torch.randint(0, 3, (len(fmap) * 8,), generator=g)
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])
    indices = torch.randint(0, 50, (int(offsets[-1]),), generator=g)
    with _OpCalls() as mode:
        module(indices, offsets).sum().backward()
    assert mode.calls.get("unique_keys_grouped") == 1 and "unique_keys" not in mode.calls
    assert mode.calls.get("embedding_pool_into_grouped") == 1
    assert mode.calls.get("embedding_backward_grouped") == 1
    assert "embedding_pool_into" not in mode.calls and "embedding_backward" not in mode.calls
    assert mode.calls.get("table_find_or_insert_slots_grouped") == 1
    assert "table_find_or_insert_slots" not in mode.calls
