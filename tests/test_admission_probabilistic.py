"""ProbabilisticAdmissionStrategy: a missing key seen k times in a batch is admitted with
probability 1 - (1 - p)^k, by a draw that is a pure function of (key, seed, table step):
the rate is within binomial bounds, a replay and a dump -> load mid-run give the same
table, both executors give the same bits, and no counter exists or is written."""

import math
import os
import subprocess
import sys

import pytest
import torch

from dynemb import (
    BatchedDynamicEmbeddingTables,
    DynamicEmbInitializerArgs,
    DynamicEmbInitializerMode,
    DynamicEmbPoolingMode,
    DynamicEmbTableOptions,
)
from dynemb.admission_strategies import ProbabilisticAdmissionStrategy, admission_draws
from dynemb.checkpoint import DynamicEmbDump, DynamicEmbLoad
from dynemb.optimizer import EmbOptimType

N = 100_000
CACHE_ROWS = 256  # below the ~600 keys trained: the cache evicts to the slow tier


def within_binomial(admitted: int, n: int, p: float) -> bool:
    """``admitted`` of ``n`` within 6 standard deviations of n * p."""
    sd = math.sqrt(n * p * (1 - p))
    return abs(admitted - n * p) <= 6 * sd + 1


@pytest.mark.parametrize("p", [0.01, 0.1, 0.5, 0.9])
@pytest.mark.parametrize("k", [1, 2, 5])
def test_admission_rate_within_binomial_bounds(p, k):
    s = ProbabilisticAdmissionStrategy(p, seed=3)
    keys = torch.randint(-(2**62), 2**62, (N,), generator=torch.Generator().manual_seed(k))
    admitted = int(s.admit(keys, torch.full((N,), k), step=17).sum())
    assert within_binomial(admitted, N, 1 - (1 - p) ** k), (admitted, N * (1 - (1 - p) ** k))


def test_a_key_mix_of_occurrences_is_admitted_at_its_own_rate():
    s = ProbabilisticAdmissionStrategy(0.2)
    k = torch.arange(N) % 4  # 0 (never admitted), 1, 2, 3
    admit = s.admit(torch.arange(N) * 7919, k, step=5)
    assert not admit[k == 0].any()
    for j in (1, 2, 3):
        assert within_binomial(int(admit[k == j].sum()), N // 4, 1 - 0.8**j)


def test_draws_are_a_pure_function_of_key_seed_and_step():
    keys = torch.arange(N)
    u = admission_draws(keys, 1, 9)
    assert u.dtype == torch.float64 and bool(((u >= 0) & (u < 1)).all())
    assert torch.equal(u, admission_draws(keys.clone(), 1, 9))
    assert torch.equal(u[5:9], admission_draws(keys[5:9], 1, 9))  # not by position
    # Another step or seed: draws independent of these (admission at p = 0.5 agrees on
    # about half the keys; a correlated draw would agree far more or far less).
    for other in (admission_draws(keys, 1, 10), admission_draws(keys, 2, 9)):
        agree = int(((u < 0.5) == (other < 0.5)).sum())
        assert within_binomial(agree, N, 0.5)
    assert within_binomial(int((u < 0.25).sum()), N, 0.25)  # uniform


def test_probability_edges_and_errors():
    keys, once = torch.arange(1000), torch.ones(1000, dtype=torch.int64)
    assert ProbabilisticAdmissionStrategy(1.0).admit(keys, once).all()
    assert not ProbabilisticAdmissionStrategy(0.0).admit(keys, once * 50).any()
    assert not ProbabilisticAdmissionStrategy(1.0).admit(keys, once * 0).any()
    huge = torch.full((1000,), 2**40)  # k far past the squarings: admitted at any p > 0
    assert ProbabilisticAdmissionStrategy(0.01).admit(keys, huge).all()
    with pytest.raises(ValueError, match=r"probability must be in \[0, 1\], got 1.5"):
        ProbabilisticAdmissionStrategy(1.5)
    with pytest.raises(TypeError, match="probability must be a float"):
        ProbabilisticAdmissionStrategy("0.1")
    with pytest.raises(TypeError, match="initializer_args"):
        ProbabilisticAdmissionStrategy(0.1, initializer_args=3)
    with pytest.raises(ValueError, match="seed must be an int64"):
        ProbabilisticAdmissionStrategy(0.1, seed=2**63)
    assert ProbabilisticAdmissionStrategy(0.1) == ProbabilisticAdmissionStrategy(0.1)
    assert ProbabilisticAdmissionStrategy(0.1) != ProbabilisticAdmissionStrategy(0.2)


def make(p=0.3, caching=False, seed=0):
    uniform = DynamicEmbInitializerArgs(mode=DynamicEmbInitializerMode.UNIFORM)
    opts = DynamicEmbTableOptions(
        dim=4, max_capacity=4096, bucket_capacity=64, initializer_args=uniform, seed=5,
        admit_strategy=ProbabilisticAdmissionStrategy(p, seed=seed), caching=caching,
        local_hbm_for_values=CACHE_ROWS * 8 * 4 if caching else 0,  # Adagrad: 8 columns
    )  # fmt: skip
    return BatchedDynamicEmbeddingTables(
        [opts], feature_table_map=[0], pooling_mode=DynamicEmbPoolingMode.SUM,
        optimizer=EmbOptimType.EXACT_ADAGRAD, learning_rate=0.1,
    )  # fmt: skip


def batches(steps: int, start: int = 0):
    gen = torch.Generator().manual_seed(11)
    out = [torch.randint(0, 600, (256,), generator=gen) for _ in range(steps)]
    return out[start:]


def train(m, keys_per_step) -> None:
    for keys in keys_per_step:
        m(keys, torch.arange(0, keys.numel() + 1, 4)).sum().backward()


def table_of(m) -> dict:
    t = m.tables[0]
    t = t.persistent_table() if t.has_cache else t
    keys, values, _, _ = t.export_batch(0, t.capacity(), include_extra=True)
    order = keys.argsort()
    return {"keys": keys[order], "values": values[order]}


def test_module_admits_by_the_rule_with_no_counter():
    m = make(p=0.3)
    assert m.admission_counters == [None]
    keys = torch.arange(2000) * 13
    occurrences = torch.cat([keys, keys[:1000]])  # the first 1000 keys twice
    m(occurrences, torch.arange(0, 3001, 1)).sum().backward()
    stored = set(table_of(m)["keys"].tolist())
    # The batch's draw is at the table's step before it (0), with k occurrences.
    k = torch.where(torch.arange(2000) < 1000, 2, 1)
    want = ProbabilisticAdmissionStrategy(0.3).admit(keys, k, step=0)
    assert stored == set(keys[want].tolist())
    assert within_binomial(len(stored), 2000, (0.51 + 0.3) / 2 * 1.0)


@pytest.mark.parametrize("caching", [False, True])
def test_replay_and_dump_load_mid_run_give_the_same_table(tmp_path, caching):
    first = make(caching=caching)
    train(first, batches(12))
    again = make(caching=caching)
    train(again, batches(6))
    DynamicEmbDump(tmp_path / "ckpt", again, optim=True, counter=True)
    files = [f for _, _, names in os.walk(tmp_path / "ckpt") for f in names]
    assert files and not [f for f in files if "count" in f.lower()]  # no counter files
    restarted = make(caching=caching)
    DynamicEmbLoad(tmp_path / "ckpt", restarted, optim=True, counter=True)
    train(restarted, batches(12, start=6))
    a, b = table_of(first), table_of(restarted)
    assert a["keys"].numel() > 0
    assert torch.equal(a["keys"], b["keys"]) and torch.equal(a["values"], b["values"])


def test_another_seed_admits_other_keys():
    a, b = make(seed=0), make(seed=1)
    train(a, batches(3))
    train(b, batches(3))
    assert not torch.equal(table_of(a)["keys"], table_of(b)["keys"])


def train_and_save(path: str) -> None:
    """Both modes on this process's executor, saved to ``path``."""
    import dynemb

    out = {"executor": dynemb.executor()}
    for caching in (False, True):
        m = make(caching=caching)
        train(m, batches(10))
        out[caching] = table_of(m)
    torch.save(out, path)


@pytest.mark.no_emulated_pass("runs both executors itself, each in its own process")
def test_both_executors_store_the_same_bits(tmp_path):
    saved = {}
    for executor in ("cpu", "cuda-emulated"):
        path = tmp_path / f"{executor}.pt"
        env = {**os.environ, "DYNEMB_EXECUTOR": executor}
        code = (
            "from tests.test_admission_probabilistic import train_and_save; "
            f"train_and_save({str(path)!r})"
        )
        done = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
        )
        assert done.returncode == 0, done.stderr[-2000:]
        saved[executor] = torch.load(path)
        assert saved[executor]["executor"] == executor
    for caching in (False, True):
        a, b = saved["cpu"][caching], saved["cuda-emulated"][caching]
        assert a["keys"].numel() > 0
        assert torch.equal(a["keys"], b["keys"]) and torch.equal(a["values"], b["values"])


def test_a_key_gets_a_fresh_draw_at_each_step():
    m = make(p=0.3)
    keys = torch.arange(1000) * 31
    for _ in range(10):  # each batch a new draw: stored after 10 sights with 1 - 0.7^10
        m(keys, torch.arange(0, 1001, 4)).sum().backward()
    assert within_binomial(table_of(m)["keys"].numel(), 1000, 1 - 0.7**10)
