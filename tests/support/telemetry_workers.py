"""Rank-side code of tests/shard/test_telemetry_sharded.py: a row-wise sharded EBC of
dynamic tables trained on this rank's share of the global batches, and what its
tables' telemetry counted."""

from dynemb import DynamicEmbTelemetry, table_telemetry
from tests.support.sharded_workers import STEPS, Case, build_model, global_batch, local_kjt

COUNTS = ("hits", "inserted", "evicted", "failed")


def trained_telemetry(rank: int, world_size: int, batch_sizes: list[int], dist_type: str):
    """This rank's counts per table (``COUNTS``, then its table's size) and its flat
    metrics, after STEPS steps on samples [start, stop) of each global batch."""
    start, stop = sum(batch_sizes[:rank]), sum(batch_sizes[: rank + 1])
    model = build_model(Case("EXACT_SGD", dist_type), world_size)
    for step in range(STEPS):
        lengths, keys, _ = global_batch(step, sum(batch_sizes), weighted=False)
        model(local_kjt(lengths, keys, None, start, stop)).values().sum().backward()
    counts = {
        name: [getattr(t, f) for f in COUNTS] + [t.window_totals().size]
        for name, t in table_telemetry(model).items()
    }
    return counts, DynamicEmbTelemetry(model).metrics()
