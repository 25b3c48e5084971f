"""Telemetry of a row-wise sharded EBC on 2 real gloo ranks: each rank counts the
keys it owns, so the ranks' counts add up to the global counts of a set-based replay
of every step's distinct keys per table (the oracle), and the metrics of each rank
are its own counts."""

import pytest

from tests.support.multiprocess import run_ranks
from tests.support.sharded_workers import FEATURE_TABLE, FEATURES, STEPS, global_batch
from tests.support.telemetry_workers import COUNTS, trained_telemetry


def _global_counts(batch_size: int) -> dict:
    """Per table: hits, inserted, evicted, failed and final size over the global
    batches (distinct keys per step; nothing evicted or failed: the tables are large)."""
    seen = {"t0": set(), "t1": set()}
    counts = {"t0": [0, 0, 0, 0], "t1": [0, 0, 0, 0]}
    for step in range(STEPS):
        lengths, keys, _ = global_batch(step, batch_size, weighted=False)
        per_feature = keys.split(lengths.sum(dim=1).tolist())
        for name in seen:
            t = int(name[1])
            distinct = {k for f, ks in enumerate(per_feature) if FEATURE_TABLE[f] == t
                        for k in ks.tolist()}  # fmt: skip
            counts[name][0] += len(distinct & seen[name])
            counts[name][1] += len(distinct - seen[name])
            seen[name] |= distinct
    return {name: c + [len(seen[name])] for name, c in counts.items()}


@pytest.mark.parametrize("dist_type", ["roundrobin", "hash_roundrobin"])
def test_rank_counts_add_up_to_the_global_counts(dist_type):
    batch_sizes = [3, 5]
    results = run_ranks(trained_telemetry, 2, batch_sizes, dist_type)
    want = _global_counts(sum(batch_sizes))
    assert len(FEATURES) == len(FEATURE_TABLE)
    for name, counts in want.items():
        per_rank = [r[0][name] for r in results]
        assert [sum(c) for c in zip(*per_rank)] == counts, name
        assert all(c[1] > 0 for c in per_rank), f"{name}: a rank owns no key"
    for rank, (counts, metrics) in enumerate(results):
        for name, c in counts.items():
            for field, value in zip(COUNTS, c):
                assert metrics[f"dynemb/{name}/{field}"] == value, (rank, name, field)
