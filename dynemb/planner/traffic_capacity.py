"""Table capacities sized from traffic: replay a sample of the id stream, scaled down.

How the replay scales down. A table of ``C`` rows is ``C / bucket_capacity`` buckets;
a key's bucket is a hash of the key, and eviction is bucket-local (the lowest score of
the key's bucket goes). Each bucket therefore sees a random share of the ids and
behaves as a small cache of ``bucket_capacity`` slots. Keeping a random ``1 / scale``
of the ids (by a hash independent of the bucket hash: every occurrence of a kept id
stays, see id_sample.py) and replaying them through a real ``ScoredHashTable`` of
``C / scale`` rows with the same ``bucket_capacity`` gives each bucket statistically
the same stream as in the full table, so the scaled table's misses are ``1 / scale``
of the full table's (spatial sampling, as in SHARDS, Waldspurger et al., FAST 2015).
Rates are estimated as ``scale * scaled evictions / all lookups``: the rare hot ids,
which sampling keeps or drops by chance, are hits either way, so this is far less
noisy than dividing by the kept lookups. A row-wise sharded table is the same
sampling again (each rank's table sees a share of the ids), so a capacity found for
the whole table holds for its ``world_size`` shards of ``capacity / world_size`` rows.

Limits:

- The scaled table needs enough buckets to average over (the search keeps at least
  32 at the answer by lowering ``scale``), and the estimate is no better
  than the sample: ``scale`` multiplies the noise of the kept ids.
- Rates are those of the sample replayed from an empty table (after
  ``warmup_batches``). A capacity that the sample does not fill shows fewer
  evictions than a longer run would: the sample must be long enough to fill the
  recommended table, or the recommendation is for a run as long as the sample.
- Eviction is the real table's, bucket-local (a full bucket evicts its own lowest
  score, not the table's): the replay reproduces it only for the table's own
  ``bucket_capacity``, and a bucket a batch fills with its own new ids refuses the
  rest (counted in ``eviction_rate`` and ``failure_rate``).
- The sample stands for the future stream: drift in the ids is not modelled.
- CUSTOMIZED scores (the user's) and NO_EVICTION (no eviction) cannot be replayed.
- DECAYED_LFU decays by the table's steps: the replay counts one step a batch, so the
  sample's batches must be the training steps of the table.
- Capacities are multiples of ``scale * bucket_capacity`` rows, found to within 1%.
"""

import dataclasses

import torch

from dynemb.config.types import DynamicEmbScoreStrategy
from dynemb.planner.id_sample import IdSample, check_id_sample, keep_ids
from dynemb.table.batch_arguments import ScoreStrategyArg, check_half_life
from dynemb.table.scored_hash_table import ScoredHashTable

__all__ = ["TrafficRates", "measure_traffic_rates", "recommend_capacity"]

_MIN_BUCKETS = 32
_AUTO_SCALED_LOOKUPS = 1 << 17
_REPLAYABLE = (
    "TIMESTAMP, STEP, LFU, DECAYED_LFU or a compound (TIMESTAMP, LFU) / (TIMESTAMP, DECAYED_LFU)"
)


@dataclasses.dataclass(frozen=True)
class TrafficRates:
    """What a table of ``capacity`` rows does with a sample of ids.

    Attributes:
        capacity: rows of the (full-size) table.
        eviction_rate: lookups of new ids that found their bucket full, per looked-up
            id (each occurrence counts): the table evicted a resident for them, or,
            when a batch's own ids fill the bucket (they are never evicted by each
            other), refused them.
        failure_rate: the refused share of ``eviction_rate``.
        hit_rate: looked-up ids that found their key stored, per looked-up id.
        lookups: ids counted (after the warm-up batches), in the full sample.
        scale: the table replayed had ``capacity / scale`` rows and saw ``1 / scale``
            of the ids (1: the full table).
    """

    capacity: int
    eviction_rate: float
    failure_rate: float
    hit_rate: float
    lookups: int
    scale: int


def _scoring(score_strategy, score_half_life_steps) -> dict:
    """The replayed table's scoring arguments, checked: a strategy a replay reproduces
    and DECAYED_LFU's half-life (with it only)."""
    S = DynamicEmbScoreStrategy
    ok = (S.TIMESTAMP, S.STEP, S.LFU, S.DECAYED_LFU)
    compound = isinstance(score_strategy, tuple) and set(score_strategy) in (
        {S.TIMESTAMP, S.LFU},
        {S.TIMESTAMP, S.DECAYED_LFU},
    )
    if not compound and (
        not isinstance(score_strategy, DynamicEmbScoreStrategy) or score_strategy not in ok
    ):
        raise ValueError(
            f"score_strategy must be {_REPLAYABLE} (a replay cannot reproduce CUSTOMIZED "
            f"scores, and NO_EVICTION never evicts), got {score_strategy!r}"
        )
    half_life = check_half_life(score_strategy, score_half_life_steps)
    return {"score_strategy": score_strategy, "score_half_life_steps": half_life}


def _check_int(name: str, value: object, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")


def _replay(batches, buckets, bucket_capacity, scoring, warmup_batches):
    """(evicted, failed, misses) of the batches after the warm-up, in ``buckets`` buckets."""
    table = ScoredHashTable(
        dim=1, capacity=buckets * bucket_capacity, bucket_capacity=bucket_capacity, **scoring
    )
    evicted = failed = misses = 0
    for i, batch in enumerate(batches):
        if batch.numel() == 0:
            continue
        table.find_or_insert(batch)
        stats = table.last_stats
        if i >= warmup_batches:
            evicted += stats.evicted
            failed += stats.failed
            misses += stats.inserted + stats.evicted + stats.failed
    return evicted, failed, misses


def _rates(batches, kept, buckets, scale, bucket_capacity, scoring, warmup):
    lookups = sum(b.numel() for b in batches[warmup:])
    if lookups == 0:
        raise ValueError(
            f"warmup_batches={warmup} leaves no id to count (the sample has "
            f"{len(batches)} batches): give a smaller warmup_batches or a longer sample"
        )
    evicted, failed, misses = _replay(kept, buckets, bucket_capacity, scoring, warmup)
    return TrafficRates(
        capacity=buckets * bucket_capacity * scale,
        eviction_rate=min(1.0, (evicted + failed) * scale / lookups),
        failure_rate=min(1.0, failed * scale / lookups),
        hit_rate=max(0.0, 1.0 - misses * scale / lookups),
        lookups=lookups,
        scale=scale,
    )


def measure_traffic_rates(
    sample: IdSample,
    capacity: int,
    score_strategy: ScoreStrategyArg = DynamicEmbScoreStrategy.TIMESTAMP,
    bucket_capacity: int = 128,
    scale: int = 1,
    warmup_batches: int = 0,
    score_half_life_steps: int | None = None,
) -> TrafficRates:
    """Replays ``sample`` through a ``ScoredHashTable`` of ``capacity / scale`` rows.

    Args:
        sample: one table's ids: a list of 1-D int64 tensors (one per batch, in stream
            order) or the path of a ``torch.save``d list.
        capacity: rows of the full-size table, a multiple of ``scale * bucket_capacity``.
        score_strategy: TIMESTAMP, STEP, LFU, DECAYED_LFU or a compound ``(TIMESTAMP,
            LFU)`` / ``(TIMESTAMP, DECAYED_LFU)``.
        bucket_capacity: slots per bucket, a positive multiple of 16.
        scale: replay ``1 / scale`` of the ids through ``1 / scale`` of the buckets
            (see the module docstring); 1 replays the full table.
        warmup_batches: leading batches replayed but not counted.
        score_half_life_steps: DECAYED_LFU's half-life in steps (batches of the
            sample); with DECAYED_LFU only, as in ``DynamicEmbTableOptions``.

    Returns:
        The ``TrafficRates`` of the table.

    Raises:
        TypeError / ValueError: a bad sample (see ``check_id_sample``) or argument,
            naming it and its value.
    """
    batches = check_id_sample(sample)
    scoring = _scoring(score_strategy, score_half_life_steps)
    _check_int("bucket_capacity", bucket_capacity, 16)
    if bucket_capacity % 16:
        raise ValueError(f"bucket_capacity must be a multiple of 16, got {bucket_capacity}")
    _check_int("scale", scale, 1)
    _check_int("warmup_batches", warmup_batches, 0)
    _check_int("capacity", capacity, scale * bucket_capacity)
    if capacity % (scale * bucket_capacity):
        raise ValueError(
            f"capacity must be a multiple of scale * bucket_capacity = "
            f"{scale * bucket_capacity}, got {capacity}"
        )
    buckets = capacity // (scale * bucket_capacity)
    kept = keep_ids(batches, scale)
    return _rates(batches, kept, buckets, scale, bucket_capacity, scoring, warmup_batches)


def _check_target(target_eviction_rate, target_hit_rate) -> tuple[str, float]:
    given = [
        (n, v)
        for n, v in (
            ("target_eviction_rate", target_eviction_rate),
            ("target_hit_rate", target_hit_rate),
        )
        if v is not None
    ]
    if len(given) != 1:
        raise ValueError(
            "give exactly one of target_eviction_rate and target_hit_rate, got "
            f"target_eviction_rate={target_eviction_rate!r}, target_hit_rate={target_hit_rate!r}"
        )
    name, value = given[0]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 < value < 1.0:
        raise ValueError(f"{name} must be a number in (0, 1), got {value!r}")
    return name, float(value)


def _meets(rates: TrafficRates, name: str, target: float) -> bool:
    if name == "target_eviction_rate":
        return rates.eviction_rate <= target
    return rates.hit_rate >= target


def _search(batches, scale, bucket_capacity, scoring, warmup, name, target):
    """Smallest bucket count (to 1%) of the scaled table meeting the target, and its rates."""
    kept = keep_ids(batches, scale)
    distinct = max(1, torch.cat(kept).unique().numel())

    def rates(buckets):
        return _rates(batches, kept, buckets, scale, bucket_capacity, scoring, warmup)

    # Start near an eighth of the distinct ids, double (halve) until the target is met
    # (missed), then bisect to within 1% of the answer.
    start = 1 << max(0, (distinct // (8 * bucket_capacity)).bit_length() - 1)
    lo, hi, hi_rates = 0, start, rates(start)  # lo misses the target (0: nothing does)
    if _meets(hi_rates, name, target):
        while hi > 1:
            low_rates = rates(hi // 2)
            if not _meets(low_rates, name, target):
                lo = hi // 2
                break
            hi, hi_rates = hi // 2, low_rates
    else:
        while not _meets(hi_rates, name, target):
            if hi * bucket_capacity >= 4 * distinct and hi_rates.eviction_rate == 0.0:
                raise ValueError(
                    f"{name}={target} is out of the sample's reach: at {hi_rates.capacity} "
                    f"rows nothing is evicted and the hit rate is {hi_rates.hit_rate:.4f} "
                    "(every miss is an id's first sight): give a lower target or a longer sample"
                )
            lo, hi = hi, 2 * hi
            hi_rates = rates(hi)
    while hi - lo > max(1, hi // 128):
        mid = (lo + hi) // 2
        mid_rates = rates(mid)
        if _meets(mid_rates, name, target):
            hi, hi_rates = mid, mid_rates
        else:
            lo = mid
    return hi, hi_rates


def recommend_capacity(
    sample: IdSample,
    target_eviction_rate: float | None = None,
    target_hit_rate: float | None = None,
    score_strategy: ScoreStrategyArg = DynamicEmbScoreStrategy.TIMESTAMP,
    bucket_capacity: int = 128,
    scale: int | None = None,
    warmup_batches: int = 0,
    score_half_life_steps: int | None = None,
) -> TrafficRates:
    """The smallest capacity whose replay of ``sample`` meets the target.

    The sample is replayed through scaled-down real tables (see the module docstring
    for how, and for the limits) while a search over the bucket count finds the
    smallest table with at most ``target_eviction_rate`` evictions per lookup, or at
    least ``target_hit_rate`` hits per lookup.

    Args:
        sample: one table's ids, as in ``measure_traffic_rates``.
        target_eviction_rate: in (0, 1); exactly one of the two targets.
        target_hit_rate: in (0, 1).
        score_strategy: the table's strategy, as in ``measure_traffic_rates``.
        bucket_capacity: the table's slots per bucket (a multiple of 16).
        scale: ids kept 1 in ``scale`` (``None``: about 2^17 lookups replayed, lowered
            until the answer has at least 32 buckets in the replayed table).
        warmup_batches: leading batches replayed but not counted.
        score_half_life_steps: DECAYED_LFU's half-life, as in ``measure_traffic_rates``.

    Returns:
        ``TrafficRates`` of the recommended table: its ``capacity`` (rows of the whole
        table; TorchRec's ``num_embeddings``) and its estimated rates.

    Raises:
        TypeError / ValueError: a bad sample or argument, naming it and its value; a
            hit rate the sample cannot reach (its ids' first sights are misses).

    Example::

        batches = [torch.randint(0, 10**6, (4096,)) for _ in range(100)]  # int64 ids
        rec = recommend_capacity(batches, target_eviction_rate=0.05,
                                 score_strategy=DynamicEmbScoreStrategy.LFU)
        rec.capacity, rec.eviction_rate  # rows of the table, its estimated rate
    """
    batches = check_id_sample(sample)
    name, target = _check_target(target_eviction_rate, target_hit_rate)
    scoring = _scoring(score_strategy, score_half_life_steps)
    _check_int("bucket_capacity", bucket_capacity, 16)
    if bucket_capacity % 16:
        raise ValueError(f"bucket_capacity must be a multiple of 16, got {bucket_capacity}")
    _check_int("warmup_batches", warmup_batches, 0)
    if scale is not None:
        _check_int("scale", scale, 1)
    total = sum(b.numel() for b in batches)
    fixed = scale is not None
    if not fixed:  # a power of two leaving about _AUTO_SCALED_LOOKUPS ids
        scale = 1 << max(0, (total // _AUTO_SCALED_LOOKUPS).bit_length() - 1)
    while True:
        buckets, rates = _search(
            batches, scale, bucket_capacity, scoring, warmup_batches, name, target
        )
        if fixed or scale == 1 or buckets >= _MIN_BUCKETS:
            return rates
        scale = max(1, scale * buckets // _MIN_BUCKETS)
