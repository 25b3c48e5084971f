"""DynamicEmb's ``get_planner``: a ready planner for a model whose tables are
data-parallel, dynamic, or ordinary row-wise (``dynemb.get_planner`` re-exports it)."""

from collections.abc import Mapping, Sequence, Set

import torch
import torch.distributed as dist
from torchrec.distributed.comm import get_local_size
from torchrec.distributed.planner import Topology
from torchrec.distributed.planner.storage_reservations import HeuristicalStorageReservation
from torchrec.distributed.planner.types import ParameterConstraints
from torchrec.distributed.types import ShardingType
from torchrec.modules.embedding_configs import BaseEmbeddingConfig

from dynemb.config.table_options import DynamicEmbTableOptions
from dynemb.planner.constraints import DynamicEmbParameterConstraints
from dynemb.planner.enumerator import DynamicEmbeddingEnumerator
from dynemb.planner.planner import DynamicEmbeddingShardingPlanner

__all__ = ["get_planner"]

_GIB = 1024**3


def get_planner(
    eb_configs: Sequence[BaseEmbeddingConfig],
    data_parallel_embedding_table_names: Set[str],
    dynamicemb_options_dict: Mapping[str, DynamicEmbTableOptions],
    device: torch.device,
    pipeline_type: str = "none",
    ddr_cap: int = 512 * _GIB,
    intra_host_bw: float = 450e9,
    inter_host_bw: float = 25e9,
) -> DynamicEmbeddingShardingPlanner:
    """A DynamicEmbeddingShardingPlanner for ``eb_configs``.

    Tables named in ``data_parallel_embedding_table_names`` are constrained to
    DATA_PARALLEL, tables in ``dynamicemb_options_dict`` are dynamic (ROW_WISE, with
    those options), every other table is an ordinary ROW_WISE table. The topology has
    the default process group's world size (1 without one), ``device``'s type, and the
    given DDR capacity and bandwidths (HBM: the GPU's memory on CUDA, TorchRec's default
    elsewhere); storage reservation is TorchRec's heuristic with 5%.

    Args:
        eb_configs: every EmbeddingConfig / EmbeddingBagConfig of the model.
        data_parallel_embedding_table_names: tables replicated on every rank.
        dynamicemb_options_dict: ``{table name: DynamicEmbTableOptions}`` of the
            dynamic tables.
        device: the ranks' compute device (``torch.device("cpu")`` or a CUDA device).
        pipeline_type: the training pipeline (``"none"``, ``"base"``, ``"sparse_dist"``,
            ``"prefetch"`` ...); accepted, the plan does not depend on it.
        ddr_cap: host memory per rank, bytes.
        intra_host_bw, inter_host_bw: bandwidths (bytes/s) for the cost model.

    Returns:
        The planner; plan with ``planner.collective_plan(model, sharders, pg)``.

    Raises:
        ValueError: a name of ``data_parallel_embedding_table_names`` or
            ``dynamicemb_options_dict`` that is not a table of ``eb_configs``, or a
            table in both; TypeError: ``device`` not a torch.device or a string.

    Example::

        planner = get_planner(configs, {"country"}, {"item": DynamicEmbTableOptions()},
                              torch.device("cpu"))
        plan = planner.collective_plan(model, [DynamicEmbeddingCollectionSharder()])
    """
    if not isinstance(device, (torch.device, str)):
        raise TypeError(f"get_planner: `device` must be a torch.device, got {device!r}")
    device = torch.device(device)
    names = {c.name for c in eb_configs}
    data_parallel, dynamic = set(data_parallel_embedding_table_names), dict(dynamicemb_options_dict)
    for arg, chosen in (
        ("data_parallel_embedding_table_names", data_parallel),
        ("dynamicemb_options_dict", set(dynamic)),
    ):
        unknown = sorted(chosen - names)
        if unknown:
            raise ValueError(
                f"get_planner: `{arg}` names {unknown}, not tables of eb_configs {sorted(names)}"
            )
    both = sorted(data_parallel & set(dynamic))
    if both:
        raise ValueError(f"get_planner: tables {both} are both data-parallel and dynamic")
    constraints: dict[str, ParameterConstraints] = {}
    for config in eb_configs:
        if config.name in data_parallel:
            constraints[config.name] = ParameterConstraints(
                sharding_types=[ShardingType.DATA_PARALLEL.value]
            )
        elif config.name in dynamic:
            constraints[config.name] = DynamicEmbParameterConstraints(
                sharding_types=[ShardingType.ROW_WISE.value],
                use_dynamicemb=True,
                dynamicemb_options=dynamic[config.name],
            )
        else:
            constraints[config.name] = ParameterConstraints(
                sharding_types=[ShardingType.ROW_WISE.value]
            )
    topology = _topology(device, ddr_cap, intra_host_bw, inter_host_bw)
    return DynamicEmbeddingShardingPlanner(
        eb_configs=list(eb_configs),
        topology=topology,
        constraints=constraints,
        enumerator=DynamicEmbeddingEnumerator(topology=topology, constraints=constraints),
        storage_reservation=HeuristicalStorageReservation(percentage=0.05),
    )


def _topology(device: torch.device, ddr_cap: int, intra_host_bw, inter_host_bw) -> Topology:
    initialized = dist.is_available() and dist.is_initialized()
    world_size = dist.get_world_size() if initialized else 1
    local_size = get_local_size(world_size) if initialized else 1
    kwargs = {}
    if device.type == "cuda":
        kwargs["hbm_cap"] = torch.cuda.get_device_properties(device).total_memory
    return Topology(
        world_size=world_size,
        local_world_size=local_size,
        compute_device=device.type,
        ddr_cap=ddr_cap,
        intra_host_bw=intra_host_bw,
        inter_host_bw=inter_host_bw,
        **kwargs,
    )
