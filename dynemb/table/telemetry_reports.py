"""The on-demand reports of a table's telemetry (upsert_counts.py): how evicted keys
compare with the keys the table kept (``EvictionSummary``) and how full its buckets
are (``BucketFill``).

Eviction quality. A table evicts the lowest score of one bucket (the key's home
bucket), not of the whole table: a global LRU / LFU would always evict the table's
lowest score. Each sampled eviction's *rank* is the fraction of the keys stored at
the start of its step whose score is strictly lower than the evicted key's (measured
over at most ``RANK_REFERENCE_SLOTS`` slots, a stride through the table: exact for
smaller tables, an unbiased estimate otherwise, keys being placed by hash). Rank 0
is what the global policy would evict; with buckets of B slots, a bucket's minimum
has an expected rank of about 1 / (B + 1) when scores are independent of buckets.
"""

import dataclasses

import torch


@dataclasses.dataclass(frozen=True)
class BucketFill:
    """Keys per bucket, over every bucket of the table.

    Attributes:
        num_buckets / bucket_capacity: the table's geometry.
        min / mean / max / std: of the keys per bucket.
        empty / full: buckets holding no key / ``bucket_capacity`` keys.
        histogram: (bucket_capacity + 1,) int64, buckets holding 0, 1, ... keys.
    """

    num_buckets: int
    bucket_capacity: int
    min: int
    mean: float
    max: int
    std: float
    empty: int
    full: int
    histogram: torch.Tensor = dataclasses.field(repr=False)


@dataclasses.dataclass(frozen=True)
class EvictionSummary:
    """The evicted residents of a table's sampled steps.

    Attributes:
        sampled_steps: steps whose evictions were recorded (evicting or not).
        count: evicted residents recorded (the latest ``max_samples`` at least).
        age_unit: "steps", "seconds", or None where the strategy keeps no last access.
        ages: (count,) float64 steps or seconds since each one's last access (at the
            step that evicted it), or None.
        scores: (count,) int64, each one's score when it was evicted.
        ranks: (count,) float64 in [0, 1), each one's rank (module docstring).
        age_p50 / age_p90: quantiles of ``ages`` (None without ages or evictions).
        rank_mean / rank_p50 / rank_p90: of ``ranks`` (None without evictions).
        lowest_decile: the fraction of evictions ranked below 0.1: evicted from the
            lowest-scored 10% of the table (a global policy: 1.0).
    """

    sampled_steps: int
    count: int
    age_unit: str | None
    ages: torch.Tensor | None = dataclasses.field(repr=False)
    scores: torch.Tensor = dataclasses.field(repr=False)
    ranks: torch.Tensor = dataclasses.field(repr=False)
    age_p50: float | None = None
    age_p90: float | None = None
    rank_mean: float | None = None
    rank_p50: float | None = None
    rank_p90: float | None = None
    lowest_decile: float | None = None


def bucket_fill(digests: torch.Tensor) -> BucketFill:
    """``BucketFill`` of a table's digests ((num_buckets, bucket_capacity) uint8, 0 =
    empty slot)."""
    per_bucket = (digests != 0).sum(dim=1)
    capacity = digests.shape[1]
    histogram = torch.bincount(per_bucket, minlength=capacity + 1).cpu()
    counts = per_bucket.double()
    return BucketFill(
        num_buckets=digests.shape[0],
        bucket_capacity=capacity,
        min=int(per_bucket.min()),
        mean=float(counts.mean()),
        max=int(per_bucket.max()),
        std=float(counts.std(correction=0)),
        empty=int(histogram[0]),
        full=int(histogram[capacity]),
        histogram=histogram,
    )


def eviction_ranks(scores: torch.Tensor, reference: torch.Tensor, stored: torch.Tensor):
    """(m,) float64 ranks of evicted ``scores`` among ``reference`` (sorted scores of the
    reference slots, empty ones at the maximum score), ``stored`` of them holding a
    key; stays on the device (no read)."""
    below = torch.searchsorted(reference, scores, side="left")
    return below.double() / stored.clamp(min=1).double()


def _quantile(x: torch.Tensor, q: float) -> float | None:
    return float(torch.quantile(x.double(), q)) if x.numel() else None


def summarize_evictions(scores, ages, age_unit, ranks, sampled_steps: int) -> EvictionSummary:
    """The ``EvictionSummary`` of recorded evictions (CPU tensors)."""
    has_ages = ages is not None and ages.numel() > 0
    return EvictionSummary(
        sampled_steps=sampled_steps,
        count=scores.numel(),
        age_unit=age_unit,
        ages=ages,
        scores=scores,
        ranks=ranks.double(),
        age_p50=_quantile(ages, 0.5) if has_ages else None,
        age_p90=_quantile(ages, 0.9) if has_ages else None,
        rank_mean=float(ranks.double().mean()) if ranks.numel() else None,
        rank_p50=_quantile(ranks, 0.5),
        rank_p90=_quantile(ranks, 0.9),
        lowest_decile=float((ranks < 0.1).double().mean()) if ranks.numel() else None,
    )


__all__ = ["BucketFill", "EvictionSummary", "bucket_fill", "eviction_ranks", "summarize_evictions"]
