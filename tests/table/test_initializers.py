"""Initializers: right distribution, and reproducible from (seed, key) alone."""

import math

import pytest
import torch

import dynemb
from dynemb import BatchedDynamicEmbeddingTables, DynamicEmbTableOptions
from dynemb import DynamicEmbInitializerArgs as Args
from dynemb import DynamicEmbInitializerMode as M
from tests.support import reference as ref

KEYS = torch.randint(-(2**63), 2**63 - 1, (20_000,), generator=torch.Generator().manual_seed(0))


def _rows(init, seed=0, keys=KEYS, dim=16, threads=None):
    if threads:
        torch.set_num_threads(threads)
    t = dynemb.ScoredHashTable(
        dim=dim,
        capacity=2**16,
        initializer=init,
        seed=seed,
        score_strategy=dynemb.DynamicEmbScoreStrategy.NO_EVICTION,
    )
    return t.find_or_insert(keys)


def test_same_seed_same_rows_whatever_the_order_and_threads():
    a = _rows(Args(), seed=5, threads=1)
    perm = torch.randperm(KEYS.numel())
    b = _rows(Args(), seed=5, keys=KEYS[perm], threads=2)
    assert torch.equal(a[perm], b)
    c = _rows(Args(), seed=6)
    assert not torch.equal(a, c)


def test_uniform_matches_the_reference_and_its_bounds():
    rows = _rows(Args(lower=-0.5, upper=0.25))
    assert rows.min() >= -0.5 and rows.max() < 0.25
    assert abs(rows.mean().item() - (-0.125)) < 0.005
    for i in range(0, 200, 37):
        want = ref.init_row(KEYS[i].item(), 0, 2, -0.5, 0.25, 16, 16, 0.0)
        assert ref.isclose_rows(rows[i], want)


def test_uniform_default_bounds_follow_capacity():
    rows = _rows(Args())
    bound = math.sqrt(1 / 2**16)
    assert rows.abs().max() <= bound and rows.abs().max() > 0.95 * bound


def test_normal_moments():
    rows = _rows(Args(mode=M.NORMAL, mean=1.0, std_dev=0.5))
    assert abs(rows.mean().item() - 1.0) < 0.01
    assert abs(rows.std().item() - 0.5) < 0.01


def test_truncated_normal_stays_within_bounds():
    rows = _rows(Args(mode=M.TRUNCATED_NORMAL, mean=0.0, std_dev=1.0, lower=-0.5, upper=1.0))
    assert rows.min() >= -0.5 and rows.max() <= 1.0
    default = _rows(Args(mode=M.TRUNCATED_NORMAL, std_dev=0.1))
    assert default.abs().max() <= 0.2 + 1e-6 and default.std() > 0.07


@pytest.mark.parametrize(
    "mode, want",
    [(M.CONSTANT, lambda k: 0.25), (M.DEBUG, lambda k: float((k % 2**64) % 100_000))],
)
def test_constant_and_debug(mode, want):
    keys = torch.tensor([0, -5, 123456, 2**23])
    rows = _rows(Args(mode=mode, value=0.25), keys=keys, dim=3)
    assert rows.tolist() == [[want(k)] * 3 for k in keys.tolist()]


def test_extra_columns_start_at_extra_init():
    t = dynemb.ScoredHashTable(dim=2, capacity=1024, extra_columns=3, extra_init=0.1)
    t.find_or_insert(torch.arange(5))
    _, values, _, _ = t.export_batch(0, t.capacity(), include_extra=True)
    assert torch.allclose(values[:, 2:], torch.full((5, 3), 0.1))


@pytest.mark.parametrize(
    "args",
    [
        Args(mode=M.UNIFORM, lower=-0.3, upper=0.2),
        Args(mode=M.NORMAL, mean=0.1, std_dev=0.4),
        Args(mode=M.TRUNCATED_NORMAL, std_dev=0.1),
    ],
)
def test_stored_rows_equal_the_rows_given_to_missing_keys(args):
    """Rows stored by an insert (init_row) equal the rows an eval lookup gives unknown
    keys (init_element): one generator, element by element, for odd dims too."""
    keys = torch.tensor([3, -11, 2**62, 77])
    for dim in (5, 8):
        opts = dict(dim=dim, max_capacity=256, bucket_capacity=16, seed=9)
        train = BatchedDynamicEmbeddingTables(
            [DynamicEmbTableOptions(initializer_args=args, **opts)], feature_table_map=[0]
        )
        train(keys, torch.arange(5))  # four bags of one key: inserts them
        stored, _ = train.tables[0].find(keys)
        lookup = BatchedDynamicEmbeddingTables(
            [DynamicEmbTableOptions(eval_initializer_args=args, **opts)], feature_table_map=[0]
        ).eval()
        assert torch.equal(lookup(keys, torch.arange(5)), stored)
