"""Stochastic rounding of float16 / bfloat16 rows (DynamicEmbTableOptions.
stochastic_rounding): the stored value is the float32 result in expectation (within
binomial bounds), small updates accumulate where rounding to nearest drops them, the
bits are the same on both executors, in a replay and after a restart, and the option
is off by default."""

import os
import subprocess
import sys

import pytest
import torch

from dynemb import (
    BatchedDynamicEmbeddingTables,
    DynamicEmbInitializerArgs,
    DynamicEmbInitializerMode,
    DynamicEmbOptimType,
    DynamicEmbPoolingMode,
    DynamicEmbTableOptions,
)
from dynemb.checkpoint import DynamicEmbDump, DynamicEmbLoad
from dynemb.optimizer import EmbOptimType

N = 4096  # keys, one bag each


def _module(dtype, rounding, start=1.0, optimizer=EmbOptimType.EXACT_SGD, lr=1.0, **kw):
    init = DynamicEmbInitializerArgs(mode=DynamicEmbInitializerMode.CONSTANT, value=start)
    options = DynamicEmbTableOptions(
        dim=4, max_capacity=2 * N, embedding_dtype=dtype, initializer_args=init,
        stochastic_rounding=rounding, seed=5,
    )  # fmt: skip
    return BatchedDynamicEmbeddingTables(
        [options], [0], pooling_mode=DynamicEmbPoolingMode.SUM, optimizer=optimizer,
        learning_rate=lr, table_names=["t"], **kw,
    )  # fmt: skip


def _step(module, grad: float, keys=None):
    keys = torch.arange(N) if keys is None else keys
    out = module(keys, torch.arange(keys.numel() + 1))
    out.backward(torch.full_like(out, grad))


def _weights(module, keys=None) -> torch.Tensor:
    keys = torch.arange(N) if keys is None else keys
    rows, found = module.tables[0].find(keys)
    assert found.all()
    return rows.float()


def _neighbours(x: float, dtype) -> tuple[float, float]:
    """The two values of ``dtype`` around positive ``x`` (bit patterns one apart)."""
    nearest = torch.tensor([x]).to(dtype)
    other = (nearest.view(torch.int16) + (-1 if nearest.item() > x else 1)).view(dtype)
    return tuple(sorted([nearest.item(), other.item()]))


def _bounds(n: int, lo: float, hi: float, x: float) -> tuple[float, float]:
    """Where n draws rounding x between lo and hi keep their count of `hi`, 6 sigma."""
    p = (x - lo) / (hi - lo)
    sigma = (n * p * (1 - p)) ** 0.5
    return n * p - 6 * sigma, n * p + 6 * sigma


@pytest.mark.parametrize(
    "dtype, start, update",
    [
        (torch.bfloat16, 1.0, 1e-3),  # bfloat16's spacing below 1: 2^-8
        (torch.float16, 1.0, 3e-4),  # float16's below 1: 2^-11
        (torch.float16, 2.0**-20, 2.0**-26),  # float16 subnormals: spacing 2^-24
    ],
    ids=["bf16", "fp16", "fp16-subnormal"],
)
def test_expected_value_is_the_float32_result(dtype, start, update):
    exact = torch.tensor(start, dtype=torch.float32) - torch.tensor(update, dtype=torch.float32)
    lo, hi = _neighbours(exact.item(), dtype)
    assert lo < exact.item() < hi  # x lies strictly between its neighbours
    module = _module(dtype, True, start=start)
    _step(module, update)
    w = _weights(module)
    assert set(w.unique().tolist()) <= {lo, hi}
    kept_high = int((w == hi).sum().item())
    low, high = _bounds(w.numel(), lo, hi, exact.item())
    assert low <= kept_high <= high, (kept_high, low, high)
    nearest = _module(dtype, False, start=start)
    _step(nearest, update)
    assert _weights(nearest).eq(exact.to(dtype).float()).all()  # all one neighbour


def test_small_updates_do_not_vanish_in_bfloat16():
    rounded, nearest = _module(torch.bfloat16, True), _module(torch.bfloat16, False)
    for _ in range(100):
        for m in (rounded, nearest):
            _step(m, 2e-4)  # 1/20 of bfloat16's spacing below 1
    assert _weights(nearest).eq(1.0).all()  # rounded back to 1 every step
    mean = _weights(rounded).mean().item()
    assert mean == pytest.approx(1.0 - 100 * 2e-4, abs=1e-3)


def test_off_by_default():
    assert DynamicEmbTableOptions(dim=4, max_capacity=16).stochastic_rounding is False


def test_option_must_be_a_bool():
    with pytest.raises(TypeError, match="stochastic_rounding must be a bool, got 1"):
        _module(torch.bfloat16, 1)


def _train(dtype, steps, module=None, first=0):
    module = module or _module(dtype, True, optimizer=DynamicEmbOptimType.FTRL, lr=0.05,
                               l1_reg=1e-3, initial_accumulator_value=0.1)  # fmt: skip
    gen = torch.Generator().manual_seed(9)
    batches = [(torch.randint(0, 3 * N, (N,), generator=gen), torch.randn(N, 4, generator=gen))
               for _ in range(first + steps)]  # fmt: skip
    for keys, g in batches[first:]:
        out = module(keys, torch.arange(N + 1))
        out.backward(g)
    return module


def _rows(module):
    table = module.tables[0]
    keys, values, _, _ = table.export_batch(0, table.capacity(), include_extra=True)
    order = keys.argsort()
    return keys[order], values[order]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_replay_and_restart_give_the_same_bits(tmp_path, dtype):
    whole = _rows(_train(dtype, 4))
    assert all(torch.equal(a, b) for a, b in zip(whole, _rows(_train(dtype, 4))))  # replay
    first = _train(dtype, 2)
    DynamicEmbDump(tmp_path, first, optim=True)
    restarted = _module(dtype, True, optimizer=DynamicEmbOptimType.FTRL, lr=0.05, l1_reg=1e-3,
                        initial_accumulator_value=0.1)  # fmt: skip
    DynamicEmbLoad(tmp_path, restarted, optim=True)
    resumed = _rows(_train(dtype, 2, module=restarted, first=2))
    assert all(torch.equal(a, b) for a, b in zip(whole, resumed))
    nearest = _module(dtype, False, optimizer=DynamicEmbOptimType.FTRL, lr=0.05, l1_reg=1e-3,
                      initial_accumulator_value=0.1)  # fmt: skip
    assert not torch.equal(_rows(_train(dtype, 4, module=nearest))[1], whole[1])


def _bits_on(executor: str, path) -> dict:
    env = {**os.environ, "DYNEMB_EXECUTOR": executor}
    code = (
        "import sys, torch; from tests.tbe.test_stochastic_rounding import _train, _rows; "
        "torch.save({str(d): _rows(_train(d, 3)) for d in (torch.bfloat16, torch.float16)}, "
        "sys.argv[1])"
    )
    subprocess.run([sys.executable, "-c", code, str(path)], env=env, check=True)
    return torch.load(path)


@pytest.mark.no_emulated_pass("runs both executors itself, each in its own process")
def test_both_executors_give_the_same_bits(tmp_path):
    cpu = _bits_on("cpu", tmp_path / "cpu.pt")
    emulated = _bits_on("cuda-emulated", tmp_path / "emulated.pt")
    for dtype, (keys, values) in cpu.items():
        assert torch.equal(keys, emulated[dtype][0]), dtype
        assert torch.equal(values, emulated[dtype][1]), dtype
