"""ScoredHashTable against the dict-based ReferenceTable: random op sequences, every strategy.

After every op the table and the oracle must agree on the per-key status, the
returned rows, evicted residents, size, found flags, values and scores of every key
ever used; at the end a full export must equal the oracle's contents.
"""

import numpy as np
import pytest
import torch

from tests.support.table_harness import EDGE_KEYS, STRATEGIES, Harness


def _random_keys(rng, h, n):
    pool = rng.integers(-(2**63), 2**63 - 1, size=max(4, n // 2), dtype=np.int64).tolist()
    old = list(h.seen)
    picks = [
        pool[i] if rng.random() < 0.5 else old[rng.integers(len(old))]
        for i in rng.integers(0, len(pool), n)
    ]
    if rng.random() < 0.3:
        picks += EDGE_KEYS
    h.seen.update(picks)
    return torch.tensor(picks, dtype=torch.int64)


@pytest.mark.parametrize("strategy", list(STRATEGIES))
@pytest.mark.parametrize("seed", [0, 1])
def test_random_operation_sequences(strategy, seed):
    rng = np.random.default_rng(seed)
    h = Harness(strategy, debug_init=seed == 1)
    for _ in range(40):
        keys = _random_keys(rng, h, int(rng.integers(0, 90)))
        op = rng.choice(
            ["find_or_insert", "insert", "insert_and_evict", "erase"], p=[0.45, 0.2, 0.2, 0.15]
        )
        if op == "find_or_insert":
            h.find_or_insert(keys, rng)
        elif op == "erase":
            h.erase(keys)
        else:
            h.insert(keys, rng, evict=op == "insert_and_evict")
        h.check_all()
    h.check_export()


def _mixed_operations(h, rng, rounds: int, max_keys: int) -> None:
    """Random find_or_insert / insert_and_evict / erase batches, each checked against
    the oracle, then the export."""
    for _ in range(rounds):
        keys = _random_keys(rng, h, int(rng.integers(0, max_keys)))
        op = rng.choice(["find_or_insert", "insert_and_evict", "erase"], p=[0.5, 0.3, 0.2])
        if op == "find_or_insert":
            h.find_or_insert(keys, rng)
        elif op == "erase":
            h.erase(keys)
        else:
            h.insert(keys, rng, evict=True)
        h.check_all()
    h.check_export()


@pytest.mark.parametrize("strategy", ["step", "customized", "no_eviction"])
@pytest.mark.parametrize("bc", [48, 128])  # 3 digest groups (not a power of two), 8
def test_random_operation_sequences_with_wide_buckets(strategy, bc):
    """Buckets of several digest groups, scanned from each key's home group: 0 divergences."""
    rng = np.random.default_rng(11)
    h = Harness(strategy, capacity=8 * bc, init_capacity=2 * bc, bc=bc)
    _mixed_operations(h, rng, rounds=40, max_keys=4 * bc)


def _tiers(tier, tmp_path):
    """ScoredHashTable arguments of a storage tier (rows move between tiers as the table grows)."""
    return {
        "memory": {},
        "hybrid": {"fast_rows": 100},  # slots [0, 100) fast, the rest slow
        "spill": {"spill_directory": str(tmp_path / "spill")},  # every row in a file
        "spill_hybrid": {"fast_rows": 40, "spill_directory": str(tmp_path / "spill")},
    }[tier]


@pytest.mark.parametrize("strategy", list(STRATEGIES))
@pytest.mark.parametrize("tier", ["hybrid", "spill", "spill_hybrid"])
def test_random_operation_sequences_in_tiers(strategy, tier, tmp_path):
    """The same semantics whatever tier holds the rows: 0 divergences from the oracle."""
    rng = np.random.default_rng(5)
    h = Harness(strategy, **_tiers(tier, tmp_path))
    _mixed_operations(h, rng, rounds=30, max_keys=90)
    storage = h.table.buffers
    if "fast_rows" in _tiers(tier, tmp_path):  # both tiers really hold rows
        occupied = storage.digests.view(-1) != 0
        assert bool(occupied[: storage.fast_slots].any())
        assert bool(occupied[storage.fast_slots :].any())


@pytest.mark.parametrize("strategy", ["lfu", "customized", "step", "no_eviction"])
def test_large_batches_through_the_parallel_executor(strategy):
    """Batches of 8192 keys run partitioned over all threads: results equal the sequential oracle."""
    torch.set_num_threads(2)
    rng = np.random.default_rng(7)
    h = Harness(strategy, dim=2, extra=0, capacity=4096, init_capacity=512, bc=16)
    for _ in range(4):
        keys = _random_keys(rng, h, 8192)
        h.find_or_insert(keys, rng)
        h.check_all()
    h.check_export()
