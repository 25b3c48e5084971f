"""FTRL-Proximal (DynamicEmbOptimType.FTRL) through the TBE module, against a float64
transcription of the paper's algorithm (tests/support/ftrl_reference.py): several steps, hot
keys, exact zeros under l1, learning_rate_power other than -0.5, a seeded accumulator;
in-batch eviction keeps every stored row a solution of its own state; checkpoints in
both layouts resume the same bits; bad hyper-parameters are refused before any change."""

import dataclasses

import pytest
import torch

from dynemb import (
    BatchedDynamicEmbeddingTables,
    DynamicEmbCheckMode,
    DynamicEmbOptimType,
    DynamicEmbPoolingMode,
    DynamicEmbTableOptions,
)
from dynemb.batched_dynamicemb_tables import BatchedDynamicEmbeddingTablesV2
from dynemb.checkpoint import DynamicEmbDump, DynamicEmbLoad
from dynemb.optimizer import EmbOptimType, get_optimizer_state_dim
from tests.support.ftrl_reference import ftrl_step, ftrl_weight

DIM, FEATURES, B = 8, 2, 48
LR = 0.1

# (learning_rate_power, initial_accumulator_value, ftrl_beta, l1_reg, l2_reg)
HYPER = [
    pytest.param((-0.5, 0.0, 1.0, 0.6, 0.1), id="paper"),
    pytest.param((-0.3, 0.1, 0.5, 0.4, 0.0), id="power-0.3-seeded"),
    pytest.param((0.0, 0.0, 1.0, 0.0, 0.5), id="power0-no-l1"),
    pytest.param((-1.0, 0.5, 0.0, 0.2, 1.0), id="power-1-seeded"),
]


def _module(hyper, capacity=4096, cls=BatchedDynamicEmbeddingTables, **kw):
    power, accumulator, beta, l1, l2 = hyper
    options = DynamicEmbTableOptions(
        dim=DIM, max_capacity=capacity, bucket_capacity=128, seed=3,
        safe_check_mode=DynamicEmbCheckMode.IGNORE,
    )  # fmt: skip
    extra = {"feature_table_map": [0] * FEATURES} if cls is BatchedDynamicEmbeddingTables else {
        "feature_table_map": [0] * FEATURES, "table_names": ["t"]
    }  # fmt: skip
    return cls(
        [options], pooling_mode=DynamicEmbPoolingMode.SUM, optimizer=DynamicEmbOptimType.FTRL,
        learning_rate=LR, learning_rate_power=power, ftrl_beta=beta, l1_reg=l1, l2_reg=l2,
        initial_accumulator_value=accumulator, **extra, **kw,
    )  # fmt: skip


def _batch(gen, key_range=400):
    lengths = torch.randint(0, 5, (FEATURES * B,), generator=gen)
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])
    keys = torch.randint(0, key_range, (int(offsets[-1]),), generator=gen)
    keys[::5] = 7  # a hot key: many indices, one update
    keys[3::17] = 11
    return keys, offsets


def _float32(x: float) -> float:
    return torch.tensor(x, dtype=torch.float32).item()


def _rows(module) -> dict[int, torch.Tensor]:
    """Every stored key -> its whole row (embedding, linear, accumulator) in float64."""
    table = module.tables[0]
    keys, values, _, _ = table.export_batch(0, table.capacity(), include_extra=True)
    return {int(k): v.double() for k, v in zip(keys, values)}


def _key_gradients(keys, offsets, out_grad):
    """Per key, the float64 sum of its bags' gradients (SUM pooling, feature-major bags)."""
    grads: dict[int, torch.Tensor] = {}
    for bag in range(offsets.numel() - 1):
        f, b = divmod(bag, B)
        g = out_grad[b, f * DIM : (f + 1) * DIM].double()
        for k in keys[offsets[bag] : offsets[bag + 1]].tolist():
            grads[k] = grads.get(k, torch.zeros(DIM, dtype=torch.float64)) + g
    return grads


@pytest.mark.parametrize("hyper", HYPER)
def test_module_matches_the_paper_over_several_steps(hyper):
    power, accumulator, beta, l1, l2 = hyper
    accumulator = _float32(accumulator)  # as the table stores it
    module = _module(hyper)
    gen = torch.Generator().manual_seed(0)
    reference: dict[int, list] = {}  # key -> [w, z, n], each a list of DIM floats
    zeros = nonzeros = 0
    for _ in range(5):
        keys, offsets = _batch(gen)
        out = module(keys, offsets)
        stored = _rows(module)
        for k in set(keys.tolist()) - set(reference):  # new: the initial row, fresh state
            row = stored[k]
            assert row[DIM : 2 * DIM].eq(0).all() and row[2 * DIM :].eq(accumulator).all()
            reference[k] = [row[:DIM].tolist(), [0.0] * DIM, [accumulator] * DIM]
        out_grad = torch.randn(out.shape, generator=gen)
        out.backward(out_grad)
        for k, g in _key_gradients(keys, offsets, out_grad).items():
            w, z, n = reference[k]
            for j in range(DIM):
                w[j], z[j], n[j] = ftrl_step(w[j], z[j], n[j], g[j].item(), LR, power, beta, l1, l2)
        stored = _rows(module)
        assert set(stored) == set(reference)
        for k, (w, z, n) in reference.items():
            row = stored[k]
            want = torch.tensor(w + z + n, dtype=torch.float64)
            torch.testing.assert_close(row, want, rtol=1e-4, atol=1e-5, msg=f"key {k}")
            for j in range(DIM):
                if abs(abs(z[j]) - l1) < 1e-4:
                    continue  # too near the threshold for float32 to agree
                if abs(z[j]) <= l1:
                    assert row[j].item() == 0.0, f"key {k} column {j}: |z| <= l1 gives 0"
                    zeros += 1
                else:
                    assert row[j].item() != 0.0
                    nonzeros += 1
    assert nonzeros > 0
    assert zeros > 0 or l1 == 0.0


def test_in_batch_eviction_keeps_rows_solutions_of_their_state():
    """More distinct keys a batch than the table holds: whatever is stored after a step
    was updated by it, so its weight is the algorithm's weight of its (z, n)."""
    hyper = (-0.5, 0.05, 1.0, 0.3, 0.1)
    power, accumulator, beta, l1, l2 = hyper
    module = _module(hyper, capacity=128)
    gen = torch.Generator().manual_seed(1)
    for _ in range(4):
        keys, offsets = _batch(gen, key_range=1 << 30)
        out = module(keys, offsets)
        out.backward(torch.randn(out.shape, generator=gen))
        stored = _rows(module)
        assert 0 < len(stored) <= 128 < keys.unique().numel()
        for k, row in stored.items():
            for j in range(DIM):
                z, n = row[DIM + j].item(), row[2 * DIM + j].item()
                assert n >= _float32(accumulator)
                want = ftrl_weight(z, n, LR, power, beta, l1, l2)
                assert row[j].item() == pytest.approx(want, rel=1e-5, abs=1e-7), (k, j)


def test_state_dim_and_layout():
    assert get_optimizer_state_dim(DynamicEmbOptimType.FTRL, 5) == 10
    module = _module((-0.5, 0.25, 0.0, 0.0, 0.0))
    assert module.tables[0].extra_columns == 2 * DIM
    keys = torch.tensor([1, 2])
    module.eval()
    module(keys, torch.tensor([0, 1, 2, 2, 2]))  # eval: nothing stored
    assert module.tables[0].size() == 0


@pytest.mark.parametrize(
    "field, value, words",
    [
        ("learning_rate", 0.0, "learning_rate must be > 0"),
        ("learning_rate_power", 0.5, "learning_rate_power must be <= 0"),
        ("ftrl_beta", -1.0, "ftrl_beta must be >= 0"),
        ("l1_reg", -0.1, "l1_reg must be >= 0"),
        ("l2_reg", float("nan"), "l2_reg must be a finite number"),
        ("initial_accumulator_value", -1.0, "initial_accumulator_value must be >= 0"),
        ("weight_decay", 0.1, "weight_decay must be 0 with FTRL"),
    ],
)
def test_bad_hyper_parameters_are_named(field, value, words):
    module = _module((-0.5, 0.0, 0.0, 0.0, 0.0))
    keys, offsets = torch.tensor([1, 2, 3]), torch.tensor([0, 1, 2, 3, 3])
    for _ in range(2):  # the second updates rows the first stored
        module(keys, offsets).sum().backward()
    before = _rows(module)
    setattr(module.optimizer_config, field, value)
    with pytest.raises(ValueError, match=words):
        module(keys, offsets).sum().backward()
    after = _rows(module)
    assert before.keys() == after.keys()
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_initial_accumulator_value_is_ftrls_only():
    options = DynamicEmbTableOptions(dim=4, max_capacity=128)
    with pytest.raises(ValueError, match="initial_accumulator_value must be 0.0 except with FTRL"):
        BatchedDynamicEmbeddingTables(
            [options], [0], optimizer=EmbOptimType.EXACT_ADAGRAD, initial_accumulator_value=0.1
        )


@pytest.mark.parametrize("layout", ["dynemb", "dynamicemb"])
def test_checkpoint_resumes_the_same_bits(tmp_path, layout):
    hyper = (-0.4, 0.1, 1.0, 0.3, 0.05)
    src = _module(hyper, cls=BatchedDynamicEmbeddingTablesV2)
    gen = torch.Generator().manual_seed(2)
    for _ in range(3):
        keys, offsets = _batch(gen)
        src(keys, offsets).backward(torch.randn(B, FEATURES * DIM, generator=gen))
    DynamicEmbDump(tmp_path, src, optim=True, format=layout)
    dst = _module(hyper, cls=BatchedDynamicEmbeddingTablesV2)
    DynamicEmbLoad(tmp_path, dst, optim=True)
    assert _rows(dst).keys() == _rows(src).keys()
    keys, offsets = _batch(gen)
    g = torch.randn(B, FEATURES * DIM, generator=gen)
    for m in (src, dst):
        m(keys, offsets).backward(g)
    a, b = _rows(src), _rows(dst)
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_dynamicemb_opt_args_name_ftrl(tmp_path):
    import json

    src = _module((-0.4, 0.1, 1.0, 0.3, 0.05), cls=BatchedDynamicEmbeddingTablesV2)
    src(torch.tensor([1]), torch.tensor([0, 1, 1])).sum().backward()
    DynamicEmbDump(tmp_path, src, optim=True, format="dynamicemb")
    (args_file,) = tmp_path.rglob("t_opt_args.json")
    args = json.loads(args_file.read_text())
    assert args["opt_type"] == "ftrl"
    assert (args["learning_rate_power"], args["ftrl_beta"]) == (-0.4, 1.0)
    assert (args["l1_reg"], args["l2_reg"], args["initial_accumulator_value"]) == (0.3, 0.05, 0.1)


def test_optimizer_config_is_a_dataclass_with_ftrl_fields():
    names = {f.name for f in dataclasses.fields(_module((-0.5, 0, 0, 0, 0)).optimizer_config)}
    assert {"learning_rate_power", "ftrl_beta", "l1_reg", "l2_reg"} <= names


def test_incremental_dump_gives_the_trained_weights():
    """An FTRL table's incremental dump: every touched key with its weights (no state)."""
    module = _module((-0.5, 0.1, 1.0, 0.3, 0.0), cls=BatchedDynamicEmbeddingTablesV2)
    gen = torch.Generator().manual_seed(4)
    for _ in range(2):
        keys, offsets = _batch(gen)
        module(keys, offsets).backward(torch.randn(B, FEATURES * DIM, generator=gen))
    rows, _ = module.incremental_dump(None)
    keys, values = rows["t"]
    stored = _rows(module)
    assert sorted(keys.tolist()) == sorted(stored)
    for k, v in zip(keys.tolist(), values):
        assert torch.equal(v.double(), stored[k][:DIM])
    assert (values == 0).any()  # l1 zeros reach the dump as zeros
