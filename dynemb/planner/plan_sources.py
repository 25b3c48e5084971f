"""Warm-start sources and the plan broadcast: ``collective_plan`` sends rank 0's plan
to every rank by pickling it, but a warm-start source (tensors, a user function, a
Storage) belongs to the rank that built it and may not pickle at all. The plan is
sent without them; each rank puts back the source of its own constraints."""

import copy
import dataclasses

from torchrec.distributed.types import ShardingPlan

from dynemb.planner.parameter_sharding import DynamicEmbParameterSharding


def _entries(plan: ShardingPlan):
    for module_plan in plan.plan.values():
        for name, ps in module_plan.items():
            if isinstance(ps, DynamicEmbParameterSharding):
                yield module_plan, name, ps


def without_warm_start(plan: ShardingPlan | None) -> ShardingPlan | None:
    """A copy of ``plan`` whose dynamic entries carry no ``warm_start`` (None: None)."""
    if plan is None:
        return None
    plan = ShardingPlan({path: dict(module_plan) for path, module_plan in plan.plan.items()})
    for module_plan, name, ps in _entries(plan):
        if ps.dynamicemb_options.warm_start is not None:
            entry = copy.copy(ps)
            entry.dynamicemb_options = dataclasses.replace(ps.dynamicemb_options, warm_start=None)
            module_plan[name] = entry
    return plan


def with_warm_start(plan: ShardingPlan, options: dict) -> ShardingPlan:
    """``plan`` with each dynamic table's ``warm_start`` taken from ``options[name]``
    (this rank's DynamicEmbTableOptions by table name), in place; returns it."""
    for _, name, ps in _entries(plan):
        source = options[name].warm_start if name in options else None
        if source is not None:
            ps.dynamicemb_options = dataclasses.replace(ps.dynamicemb_options, warm_start=source)
    return plan


__all__ = ["with_warm_start", "without_warm_start"]
