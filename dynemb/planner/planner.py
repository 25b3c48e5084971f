"""TorchRec's EmbeddingShardingPlanner, returning per-rank options for dynamic tables."""

import dataclasses
from collections.abc import Sequence

import torch.distributed as dist
from torch import nn
from torchrec.distributed.collective_utils import invoke_on_rank_and_broadcast_result
from torchrec.distributed.comm import get_local_size, get_topology_domain_multiple
from torchrec.distributed.planner.constants import BATCH_SIZE
from torchrec.distributed.planner.planners import EmbeddingShardingPlanner
from torchrec.distributed.planner.types import (
    Enumerator,
    ParameterConstraints,
    Partitioner,
    PerfModel,
    Proposer,
    Stats,
    StorageReservation,
    Topology,
)
from torchrec.distributed.types import (
    ModuleSharder,
    ParameterSharding,
    ShardingPlan,
    ShardingPlanner,
    ShardingType,
)
from torchrec.distributed.utils import get_device_type
from torchrec.modules.embedding_configs import BaseEmbeddingConfig

from dynemb.config.table_options import DynamicEmbTableOptions
from dynemb.distributed.rank_faults import DEFAULT_TIMEOUT_S, RankAgreement, collective
from dynemb.distributed.sharding_names import DYNAMIC_KERNEL_NAME, DYNAMIC_SHARDING_TYPES
from dynemb.planner.constraints import is_dynamic
from dynemb.planner.enumerator import DynamicEmbeddingEnumerator
from dynemb.planner.ordinary_tables import ordinary_table_constraints, with_headroom
from dynemb.planner.parameter_sharding import DynamicEmbParameterSharding
from dynemb.planner.plan_sources import with_warm_start, without_warm_start
from dynemb.planner.rank_options import (
    fill_rank_options,
    fill_user_options,
    planner_inputs,
    table_ranks,
)
from dynemb.planner.validation import check_planner_inputs

__all__ = ["DynamicEmbeddingShardingPlanner"]

_PARAMETER_SHARDING_FIELDS = tuple(f.name for f in dataclasses.fields(ParameterSharding))


class DynamicEmbeddingShardingPlanner(ShardingPlanner):
    """Plans a model with dynamic and ordinary tables (TorchRec's planner arguments).

    TorchRec's ``EmbeddingShardingPlanner`` does the planning with a
    ``DynamicEmbeddingEnumerator``; each dynamic table's plan entry then becomes a
    ``DynamicEmbParameterSharding`` (CUSTOMIZED_KERNEL; ROW_WISE with TorchRec's
    row-wise ``sharding_spec`` over all ranks, TABLE_WISE with one shard on the rank
    TorchRec's partitioner chose, COLUMN_WISE with TorchRec's column shards, or
    TABLE_ROW_WISE with TorchRec's row-wise shards over the ranks of the node its
    partitioner chose; the spec's row counts are nominal: a dynamic table holds any
    int64 key) carrying the table's per-rank options (table-row-wise: a share of the
    node's ``intra_group_size`` ranks; table-wise and column-wise: the whole table's
    capacity and HBM budget; a column slice takes its share when it is built). A
    dynamic table is planned under the sharding types its constraints'
    ``sharding_types`` list (ROW_WISE, TABLE_WISE, COLUMN_WISE, and TABLE_ROW_WISE for
    pooled tables; ROW_WISE alone when unset), TorchRec's proposers picking the
    cheapest. Ordinary tables keep TorchRec's ``ParameterSharding``.

    Args:
        eb_configs: every ``EmbeddingBagConfig`` / ``EmbeddingConfig`` of the model; a
            dynamic table's options are filled from its config.
        topology: the devices (default: TorchRec's, from the default process group).
        batch_size: batch size per rank (default: TorchRec's, 512).
        enumerator: default ``DynamicEmbeddingEnumerator(topology, batch_size,
            constraints)``. Another enumerator must give dynamic tables ROW_WISE,
            TABLE_WISE, COLUMN_WISE or TABLE_ROW_WISE with CUSTOMIZED_KERNEL, or
            ``plan`` raises.
        storage_reservation, proposer, partitioner, performance_model, stats, debug: as
            in TorchRec's ``EmbeddingShardingPlanner`` (same defaults).
        constraints: per-table constraints by table name: ``ParameterConstraints`` or
            ``DynamicEmbParameterConstraints`` (``use_dynamicemb=True`` for dynamic tables).
            As DynamicEmb's planner, each plan fills a dynamic table's
            ``dynamicemb_options`` in place with its per-rank values (``max_capacity``,
            ``local_hbm_for_values``, ``dim``, ...; ``rank_options.fill_user_options``:
            an object shared by tables gets what they agree on); planning again starts
            from the user's values (``rank_options.planner_inputs``). Nothing else is
            modified.
        ordinary_tables_as_dynamic: (dynemb only) plan every table of ``eb_configs``
            that is not dynamic as a dynamic table that keeps an ordinary table's
            meaning (ids in ``[0, num_embeddings)``, TorchRec's row-wise blocks and
            initialisation, every row stored at build time, no eviction), so that the
            whole model trains with the sharders' fused optimizer, Adam included, on
            CPU (TorchRec's CPU kernels have no Adam). Its plan entries have
            ``ordinary_table=True``.

    Raises:
        TypeError / ValueError at construction, naming the table: a constraint for a table
            not in ``eb_configs``, duplicate table names, CUSTOMIZED_KERNEL without
            ``use_dynamicemb``, a dynamic table constrained to other sharding types /
            kernels, ``dynamicemb_options`` that disagree with the config (``dim``) or are
            out of range (``bucket_capacity`` not a multiple of 16 in
            [16, MAX_BUCKET_CAPACITY], ``init_capacity < 1``, negative
            ``global_hbm_for_values``, invalid initializer args, ...); with
            ``ordinary_tables_as_dynamic``, an ordinary table constrained to other
            sharding types / kernels than ROW_WISE / CUSTOMIZED_KERNEL.

    Example::

        eb_configs = [
            EmbeddingBagConfig(name="user_id", embedding_dim=16, num_embeddings=1 << 20,
                               feature_names=["user"]),
            EmbeddingBagConfig(name="country", embedding_dim=16, num_embeddings=300,
                               feature_names=["country"]),
        ]
        planner = DynamicEmbeddingShardingPlanner(
            eb_configs,
            topology=Topology(world_size=2, compute_device="cpu"),
            constraints={"user_id": DynamicEmbParameterConstraints(use_dynamicemb=True)},
        )
        ebc = EmbeddingBagCollection(tables=eb_configs, device=torch.device("meta"))
        plan = planner.collective_plan(ebc, [DynamicEmbeddingBagCollectionSharder()])
        plan.plan[""]["user_id"].dynamicemb_options.max_capacity  # 524288 rows per rank
    """

    def __init__(
        self,
        eb_configs: Sequence[BaseEmbeddingConfig],
        topology: Topology | None = None,
        batch_size: int | None = None,
        enumerator: Enumerator | None = None,
        storage_reservation: StorageReservation | None = None,
        proposer: Proposer | list[Proposer] | None = None,
        partitioner: Partitioner | None = None,
        performance_model: PerfModel | None = None,
        stats: Stats | list[Stats] | None = None,
        constraints: dict[str, ParameterConstraints] | None = None,
        debug: bool = True,
        ordinary_tables_as_dynamic: bool = False,
    ) -> None:
        self._configs = check_planner_inputs(eb_configs, constraints)
        self._ordinary = set()
        if ordinary_tables_as_dynamic:
            merged = ordinary_table_constraints(self._configs, constraints)
            self._ordinary = {
                name for name in self._configs if not is_dynamic((constraints or {}).get(name))
            }
            constraints = merged
        if topology is None:
            # TorchRec's default, built here because the enumerator needs it first.
            topology = Topology(
                local_world_size=get_local_size(),
                world_size=dist.get_world_size(),
                compute_device=get_device_type(),
                pod_size=get_topology_domain_multiple(),
            )
        batch_size = batch_size or BATCH_SIZE
        self._topology = topology
        self._dynamic = {
            name: c.dynamicemb_options for name, c in (constraints or {}).items() if is_dynamic(c)
        }
        # Filled now so that bad options fail at construction; refilled by each plan
        # so that no two plans share option objects.
        for name, options in self._dynamic.items():
            fill_rank_options(
                name, self._configs[name], planner_inputs(options), topology.world_size
            )
        self._planner = EmbeddingShardingPlanner(
            topology=topology,
            batch_size=batch_size,
            enumerator=enumerator
            or DynamicEmbeddingEnumerator(
                topology=topology, batch_size=batch_size, constraints=constraints
            ),
            storage_reservation=storage_reservation,
            proposer=proposer,
            partitioner=partitioner,
            performance_model=performance_model,
            stats=stats,
            constraints=constraints,
            debug=debug,
        )

    def plan(self, module: nn.Module, sharders: list[ModuleSharder[nn.Module]]) -> ShardingPlan:
        """Plans ``module`` (usually on the meta device) on this process alone.

        Args:
            module: the model, or the EBC / EC itself.
            sharders: e.g. ``[DynamicEmbeddingBagCollectionSharder(),
                DynamicEmbeddingCollectionSharder()]``.

        Returns:
            TorchRec's plan, with a ``DynamicEmbParameterSharding`` for each dynamic table
            (its own copy of the per-rank options, also written into the user's).

        Raises:
            ValueError: a dynamic table whose sharder does not offer its sharding types /
                CUSTOMIZED_KERNEL, that the enumerator did not give them, or whose
                parameter in ``module`` disagrees with its config in ``eb_configs``.
            PlannerError: a rank's HBM or host memory budget (the topology's ``hbm_cap``
                / ``ddr_cap``) cannot hold its shards of the dynamic tables (the message
                names the rank, the memory and the tables), or TorchRec found no plan.
        """
        return self._fill_user_options(self._plan(module, sharders))

    def _plan(self, module: nn.Module, sharders: list[ModuleSharder[nn.Module]]) -> ShardingPlan:
        sharding_plan = self._planner.plan(module, sharders)
        for module_plan in sharding_plan.plan.values():
            for name, ps in module_plan.items():
                if name in self._dynamic:
                    module_plan[name] = self._dynamic_entry(name, ps)
                elif ps.compute_kernel == DYNAMIC_KERNEL_NAME:
                    raise ValueError(
                        f"table {name!r} got compute kernel {DYNAMIC_KERNEL_NAME!r} but is not "
                        "dynamic; check the enumerator and the sharders"
                    )
        return sharding_plan

    def collective_plan(
        self,
        module: nn.Module,
        sharders: list[ModuleSharder[nn.Module]],
        pg: dist.ProcessGroup | None = None,
        fault_timeout: float = DEFAULT_TIMEOUT_S,
    ) -> ShardingPlan:
        """Plans on rank 0 of ``pg`` (default: the world) and broadcasts the plan to every rank.

        Same arguments, result and errors as ``plan``; every rank must call it. Options
        ``warm_start`` sources are not sent: each rank's plan carries its own. When
        planning fails on rank 0 (a PlannerError) or rank 0 dies, every other rank
        raises RankFailure naming rank 0 and its error instead of waiting for a plan
        (within ``fault_timeout`` seconds for a rank that died; at once otherwise).
        """
        if pg is None:
            if not dist.is_initialized():
                raise RuntimeError(
                    "collective_plan needs a process group: call "
                    "torch.distributed.init_process_group first, or use plan()"
                )
            pg = dist.GroupMember.WORLD
        with RankAgreement(pg, "collective_plan", fault_timeout):
            plan = self._plan(module, sharders) if pg.rank() == 0 else None
            sent = without_warm_start(plan)  # sources stay on their rank (plan_sources.py)
            plan = collective(invoke_on_rank_and_broadcast_result, pg, 0, lambda: sent)
            return self._fill_user_options(with_warm_start(plan, self._dynamic))

    def _fill_user_options(self, plan: ShardingPlan) -> ShardingPlan:
        # As DynamicEmb: the user's options get the per-rank values, on every rank.
        fill_user_options(
            (name, self._dynamic[name], ps.dynamicemb_options)
            for module_plan in plan.plan.values()
            for name, ps in module_plan.items()
            if name in self._dynamic and name not in self._ordinary
        )
        return plan

    def _dynamic_entry(self, name: str, ps: ParameterSharding) -> DynamicEmbParameterSharding:
        if (
            ps.sharding_type not in DYNAMIC_SHARDING_TYPES
            or ps.compute_kernel != DYNAMIC_KERNEL_NAME
        ):
            raise ValueError(
                f"table {name!r} is dynamic but was planned {ps.sharding_type!r} / "
                f"{ps.compute_kernel!r}; pass a DynamicEmbeddingEnumerator (or none)"
            )
        config = self._configs[name]
        shards = ps.sharding_spec.shards if ps.sharding_spec else []
        rows = sum(s.shard_sizes[0] for s in shards)
        dims = {s.shard_sizes[1] for s in shards}
        if ps.sharding_type == ShardingType.COLUMN_WISE.value:  # every row, a slice each
            rows = max((s.shard_sizes[0] for s in shards), default=0)
            dims = {sum(s.shard_sizes[1] for s in shards)}
        if rows != config.num_embeddings or dims != {config.embedding_dim}:
            raise ValueError(
                f"table {name!r}: the module's parameter ({rows} rows, dims {sorted(dims)}) "
                f"disagrees with eb_configs (num_embeddings={config.num_embeddings}, "
                f"embedding_dim={config.embedding_dim})"
            )
        ranks = table_ranks(
            ps.sharding_type, self._topology.world_size, self._topology.intra_group_size
        )
        options: DynamicEmbTableOptions = fill_rank_options(
            name, config, planner_inputs(self._dynamic[name]), ranks
        )
        ordinary = name in self._ordinary
        if ordinary:
            options = with_headroom(options)
        fields = {f: getattr(ps, f) for f in _PARAMETER_SHARDING_FIELDS}
        return DynamicEmbParameterSharding(
            **fields,
            dist_type=options.dist_type,
            dynamicemb_options=options,
            ordinary_table=ordinary,
        )
