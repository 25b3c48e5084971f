"""Telemetry of a model's dynamic tables: each table's ``TableTelemetry`` (counts of
hits, inserts, evictions and failures per step, load factor, evicted keys' ages and
ranks, bucket fill), gathered over a ``BatchedDynamicEmbeddingTables`` or a sharded
model, as flat metrics a training loop logs, on TensorBoard, or as a text summary.

On a sharded model each rank reports its own shard of every table (row-wise: the
keys it owns); summing the counts of every rank gives the table's.
"""

from collections.abc import Iterable

import torch.nn as nn

from dynemb.table.telemetry_reports import BucketFill, EvictionSummary
from dynemb.table.upsert_counts import StepCounts, TableTelemetry
from dynemb.table_groups import table_groups
from dynemb.tbe.batched_dynamic_embedding_tables import BatchedDynamicEmbeddingTables

_COUNTS = ("hits", "inserted", "evicted", "failed")


def table_telemetry(model: nn.Module) -> dict[str, TableTelemetry]:
    """Every dynamic table's TableTelemetry on this rank, by table name.

    Args:
        model: a ``BatchedDynamicEmbeddingTables``, or a module holding some (a
            ``DistributedModelParallel`` model, a sharded collection).

    Raises:
        ValueError: two tables of ``model`` on this rank have one name.

    Example::

        telemetry = dynemb.table_telemetry(dmp_model)
        print(telemetry["items"].evicted, telemetry["items"].load_factor())
    """
    found: dict[str, TableTelemetry] = {}
    for module in _modules(model):
        for name, telemetry in module.telemetry().items():
            if name in found and found[name] is not telemetry:
                raise ValueError(f"table_telemetry: two dynamic tables are named {name!r}")
            found[name] = telemetry
    return found


def _modules(model: nn.Module) -> Iterable[BatchedDynamicEmbeddingTables]:
    return [group for _, group in table_groups(model)]


_RULE_COUNTS = ("rule_passes", "rule_buckets", "rule_erased")  # eviction by rule


def step_metrics(telemetry: TableTelemetry) -> dict[str, float]:
    """One table's cheap metrics (host counters only): totals, the last step's counts,
    the rates over the recent window (per distinct key looked up), load factor."""
    last = telemetry.last or StepCounts(0, 0, 0, 0, 0, 0, 0)
    window = telemetry.window_totals()
    looked_up = sum(getattr(window, f) for f in _COUNTS)
    out = {f: float(getattr(telemetry, f)) for f in ("steps", *_COUNTS)}
    out.update({f: float(getattr(telemetry, f)) for f in _RULE_COUNTS})
    out.update({f"step_{f}": float(getattr(last, f)) for f in _COUNTS})
    for f, rate in (("hits", "hit_rate"), ("evicted", "eviction_rate"), ("failed", "failure_rate")):
        out[f"window_{rate}"] = getattr(window, f) / looked_up if looked_up else 0.0
    out["load_factor"] = telemetry.load_factor()
    out["size"] = float(window.size)
    out["capacity"] = float(window.capacity)
    return out


def detailed_metrics(telemetry: TableTelemetry) -> dict[str, float]:
    """One table's on-demand metrics: bucket fill (a pass over the table) and the
    sampled evictions' ages and ranks (a read of the samples); absent ones omitted."""
    fill: BucketFill = telemetry.bucket_fill()
    out = {f"bucket_fill_{f}": float(getattr(fill, f)) for f in ("min", "mean", "max", "std")}
    ev: EvictionSummary = telemetry.evictions()
    out["evictions_sampled"] = float(ev.count)
    for f in ("age_p50", "age_p90", "rank_mean", "rank_p50", "rank_p90", "lowest_decile"):
        value = getattr(ev, f)
        if value is not None:
            out[f"eviction_{f}"] = float(value)
    return out


class DynamicEmbTelemetry:
    """The telemetry of a model's dynamic tables on this rank, as TorchRec-style
    metrics (``"dynemb/<table>/<metric>" -> float``).

    Args:
        model: as in ``table_telemetry``.
        **settings: passed to every table's ``TableTelemetry.configure`` (``window``,
            ``sample_every``, ``max_samples``, ``enabled``).

    Example::

        stats = DynamicEmbTelemetry(dmp_model, sample_every=50)
        for step, batch in enumerate(loader):
            train_step(dmp_model, batch)
            if step % 100 == 0:
                stats.write_to_tensorboard(writer, step, detailed=step % 1000 == 0)
    """

    def __init__(self, model: nn.Module, **settings) -> None:
        self.model = model
        tables = table_telemetry(model)
        for telemetry in tables.values():
            telemetry.configure(**settings)

    def tables(self) -> dict[str, TableTelemetry]:
        """Each table's TableTelemetry, by name (found again: tables may be rebuilt)."""
        return table_telemetry(self.model)

    def metrics(self, detailed: bool = False, prefix: str = "dynemb") -> dict[str, float]:
        """Flat metrics of every table: ``step_metrics`` (no device read), and with
        ``detailed`` also ``detailed_metrics`` (bucket fill and evictions: on demand)."""
        out = {}
        for name, telemetry in self.tables().items():
            values = step_metrics(telemetry)
            if detailed:
                values.update(detailed_metrics(telemetry))
            out.update({f"{prefix}/{name}/{k}": v for k, v in values.items()})
        return out

    def write_to_tensorboard(self, writer, step: int, detailed: bool = False) -> dict[str, float]:
        """Writes ``metrics(detailed)`` with ``writer.add_scalar(tag, value, step)``: a
        ``torch.utils.tensorboard.SummaryWriter`` (needs the ``tensorboard`` package), or
        any object with that method. Returns the metrics written."""
        if not callable(getattr(writer, "add_scalar", None)):
            raise TypeError(
                "write_to_tensorboard: writer must have add_scalar(tag, value, step) (a "
                f"torch.utils.tensorboard.SummaryWriter), got {type(writer).__name__}"
            )
        metrics = self.metrics(detailed)
        for tag, value in metrics.items():
            writer.add_scalar(tag, value, step)
        return metrics

    def summary(self) -> str:
        """A table of every dynamic table's telemetry on this rank (one line each)."""
        return format_summary(self.tables())


def format_summary(tables: dict[str, TableTelemetry]) -> str:
    """One line per table: steps, totals, window hit rate, load factor, bucket fill
    and evictions (computes the on-demand reports)."""
    head = (f"{'table':<16} {'steps':>6} {'hits':>10} {'inserted':>9} {'evicted':>9} "
            f"{'failed':>7} {'hit%':>6} {'load':>5} {'fill min/mean/max':>18} "
            f"{'evict age p50':>14} {'rank':>6} {'<p10':>5}")  # fmt: skip
    lines = [head]
    for name, t in tables.items():
        m, d = step_metrics(t), detailed_metrics(t)
        fill = f"{d['bucket_fill_min']:.0f}/{d['bucket_fill_mean']:.1f}/{d['bucket_fill_max']:.0f}"
        age = d.get("eviction_age_p50")
        age = "-" if age is None else f"{age:.3g} {t.age_unit}"
        rank = f"{d['eviction_rank_mean']:.3f}" if "eviction_rank_mean" in d else "-"
        low = f"{d['eviction_lowest_decile']:.2f}" if "eviction_lowest_decile" in d else "-"
        lines.append(
            f"{name:<16} {t.steps:>6} {t.hits:>10} {t.inserted:>9} {t.evicted:>9} "
            f"{t.failed:>7} {100 * m['window_hit_rate']:>6.1f} {m['load_factor']:>5.2f} "
            f"{fill:>18} {age:>14} {rank:>6} {low:>5}"
        )  # fmt: skip
    return "\n".join(lines)


__all__ = [
    "DynamicEmbTelemetry",
    "detailed_metrics",
    "format_summary",
    "step_metrics",
    "table_telemetry",
]
