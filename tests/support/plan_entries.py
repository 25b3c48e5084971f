"""Rank-side helpers of the sharded tests: a plan entry of TorchRec's generators made a
dynamic table's, and a module sharded by DistributedModelParallel on cpu."""

import dataclasses

import torch
import torch.distributed as dist
from torchrec.distributed.model_parallel import DistributedModelParallel
from torchrec.distributed.types import ShardingEnv, ShardingPlan

from dynemb.planner import DynamicEmbParameterSharding


def dynamic_entry(entry, options, **fields) -> DynamicEmbParameterSharding:
    """``entry`` (a ParameterSharding) as a dynamic table's with ``options``, and
    ``fields`` replaced (e.g. ``compute_kernel``)."""
    own = {f.name: getattr(entry, f.name) for f in dataclasses.fields(entry)}
    return DynamicEmbParameterSharding(**{**own, **fields}, dynamicemb_options=options)


def sharded_model(module, plan, sharder) -> DistributedModelParallel:
    """``module`` sharded over the world group on cpu; ``plan``: the module's plan (the
    root module's entries) or a whole ShardingPlan."""
    if not isinstance(plan, ShardingPlan):
        plan = ShardingPlan({"": plan})
    return DistributedModelParallel(
        module,
        env=ShardingEnv.from_process_group(dist.group.WORLD),
        plan=plan,
        sharders=[sharder],
        device=torch.device("cpu"),
    )
