"""Capacities of a model's dynamic tables from samples of their id streams, for the planner.

``recommend_capacities`` sizes each sampled table under its own constraints' score
strategy and bucket width (traffic_capacity.py says how); ``configs_with_capacities``
writes the capacities into the TorchRec configs as ``num_embeddings``, which
``DynamicEmbeddingShardingPlanner`` turns into each rank's ``max_capacity``
(``ceil(num_embeddings / world_size)`` rounded up to buckets).
"""

import dataclasses
from collections.abc import Mapping, Sequence

from torchrec.distributed.planner.types import ParameterConstraints
from torchrec.modules.embedding_configs import BaseEmbeddingConfig

from dynemb.config.table_options import DynamicEmbTableOptions
from dynemb.config.types import DynamicEmbScoreStrategy
from dynemb.planner.constraints import is_dynamic
from dynemb.planner.id_sample import IdSample
from dynemb.planner.traffic_capacity import TrafficRates, recommend_capacity

__all__ = ["configs_with_capacities", "recommend_capacities"]

Target = float | Mapping[str, float] | None


def _target_of(name: str, arg: str, target: Target) -> float | None:
    if isinstance(target, Mapping):
        if name not in target:
            raise ValueError(f"{arg} has no entry for table {name!r} (it has {sorted(target)})")
        return target[name]
    return target


def recommend_capacities(
    samples: Mapping[str, IdSample],
    constraints: Mapping[str, ParameterConstraints] | None = None,
    target_eviction_rate: Target = None,
    target_hit_rate: Target = None,
    scale: int | None = None,
    warmup_batches: int = 0,
) -> dict[str, TrafficRates]:
    """Recommends each sampled table's capacity (rows of the whole table).

    Args:
        samples: by table name, a sample of the table's id stream: a list of 1-D int64
            tensors (one per batch) or the path of a ``torch.save``d list.
        constraints: the planner's constraints; a table's ``score_strategy``,
            ``score_half_life_steps`` and ``bucket_capacity`` come from its ``DynamicEmbParameterConstraints``'
            ``dynamicemb_options`` (default options for a table without them).
        target_eviction_rate: a number in (0, 1), or one by table name.
        target_hit_rate: the same; exactly one of the two targets.
        scale, warmup_batches: as in ``recommend_capacity``.

    Returns:
        By table name, the ``TrafficRates`` of the recommended capacity.

    Raises:
        TypeError / ValueError: from ``recommend_capacity``, prefixed with the table.

    Example::

        rates = recommend_capacities({"user_id": batches}, constraints,
                                     target_eviction_rate=0.05)
        eb_configs = configs_with_capacities(eb_configs, rates)
        planner = DynamicEmbeddingShardingPlanner(eb_configs, topology, constraints=constraints)
    """
    if not isinstance(samples, Mapping) or not samples:
        raise ValueError(
            f"samples must be a non-empty dict of table name -> id sample, got {samples!r}"
        )
    out = {}
    for name, sample in samples.items():
        c = (constraints or {}).get(name)
        options = c.dynamicemb_options if is_dynamic(c) else DynamicEmbTableOptions()
        strategy = options.score_strategy or DynamicEmbScoreStrategy.TIMESTAMP
        try:
            out[name] = recommend_capacity(
                sample,
                target_eviction_rate=_target_of(name, "target_eviction_rate", target_eviction_rate),
                target_hit_rate=_target_of(name, "target_hit_rate", target_hit_rate),
                score_strategy=strategy,
                bucket_capacity=options.bucket_capacity,
                scale=scale,
                warmup_batches=warmup_batches,
                score_half_life_steps=options.score_half_life_steps,
            )
        except (TypeError, ValueError) as e:
            raise type(e)(f"table {name!r}: {e}") from None
    return out


def configs_with_capacities(
    eb_configs: Sequence[BaseEmbeddingConfig],
    capacities: Mapping[str, TrafficRates | int],
) -> list[BaseEmbeddingConfig]:
    """Copies of ``eb_configs`` whose ``num_embeddings`` is the table's capacity.

    Args:
        eb_configs: the model's ``EmbeddingBagConfig`` / ``EmbeddingConfig`` list.
        capacities: by table name, a ``TrafficRates`` (``recommend_capacities``) or a
            row count; tables not named keep their config.

    Raises:
        ValueError: a name that is no config's, or a capacity that is not a positive int.
    """
    names = {c.name for c in eb_configs}
    unknown = sorted(set(capacities) - names)
    if unknown:
        raise ValueError(
            f"capacities name tables {unknown} that are not in eb_configs {sorted(names)}"
        )
    out = []
    for config in eb_configs:
        cap = capacities.get(config.name)
        if isinstance(cap, TrafficRates):
            cap = cap.capacity
        if cap is None:
            out.append(config)
            continue
        if isinstance(cap, bool) or not isinstance(cap, int) or cap < 1:
            raise ValueError(f"capacities[{config.name!r}] must be a positive int, got {cap!r}")
        out.append(dataclasses.replace(config, num_embeddings=cap))
    return out
