"""Per-rank memory of dynamic tables: device (HBM) and host (DDR) bytes, and the check
that every rank's budget holds them.

As in DynamicEmb, a dynamic table's value rows (embedding + optimizer state) are
counted: on a GPU the first ``local_hbm_for_values`` bytes of a rank's rows in HBM
and the rest in host memory (``dynemb.table.placement``: the slow tier); in caching
mode the cache (``local_hbm_for_values`` bytes) in HBM and the whole table behind it
in host memory; on a CPU everything (cache included) in host memory. Keys, scores and digests are not
counted (as in ``get_table_value_bytes``). A table with ``hot_replicas`` adds, on every
rank, its replica's rows (``hot_replica_rows``) where its fast rows live.
"""

from collections.abc import Iterable

from torchrec.distributed.planner.types import (
    PlannerError,
    PlannerErrorType,
    Storage,
    Topology,
)

from dynemb.config.table_options import DynamicEmbTableOptions
from dynemb.planner.rank_options import local_hbm_bytes

__all__ = ["check_rank_budgets", "dynamic_rank_storage"]


def dynamic_rank_storage(
    options: DynamicEmbTableOptions,
    value_bytes: int,
    compute_device: str,
    world_size: int,
    replica_bytes: int = 0,
) -> Storage:
    """One rank's storage of a dynamic table whose rank holds ``value_bytes`` of rows,
    plus ``replica_bytes`` of its hot keys' replica (device memory on a GPU).

    Example::

        dynamic_rank_storage(DynamicEmbTableOptions(global_hbm_for_values=2 << 20),
                             value_bytes=4 << 20, compute_device="cuda", world_size=2)
        # Storage(hbm=1 MiB, ddr=3 MiB)
    """
    storage = _table_storage(options, value_bytes, compute_device, world_size)
    if compute_device == "cpu":
        return Storage(hbm=storage.hbm, ddr=storage.ddr + replica_bytes)
    return Storage(hbm=storage.hbm + replica_bytes, ddr=storage.ddr)


def _table_storage(options, value_bytes: int, compute_device: str, world_size: int) -> Storage:
    fast = min(value_bytes, local_hbm_bytes(options, world_size))
    if options.caching:  # the cache, and behind it a table of every row
        if compute_device == "cpu":
            return Storage(hbm=0, ddr=fast + value_bytes)
        return Storage(hbm=fast, ddr=value_bytes)
    if compute_device == "cpu":
        return Storage(hbm=0, ddr=value_bytes)
    return Storage(hbm=fast, ddr=value_bytes - fast)


def check_rank_budgets(topology: Topology, tables: Iterable[tuple[str, Storage]]) -> None:
    """Raises PlannerError (INSUFFICIENT_STORAGE) when a rank's HBM or host memory cannot
    hold its shards of the dynamic ``tables`` ((name, per-rank storage) pairs; every
    dynamic table is row-wise over all ranks), naming the rank, the memory, the budget
    and the largest tables."""
    tables = list(tables)
    for rank, device in enumerate(topology.devices):
        for field, memory, cap in (
            ("hbm", "device memory (HBM)", "hbm_cap"),
            ("ddr", "host memory (DDR)", "ddr_cap"),
        ):
            shares = sorted(((getattr(s, field), n) for n, s in tables), reverse=True)
            need = sum(b for b, _ in shares)
            budget = getattr(device.storage, field)
            if need <= budget:
                continue
            largest = ", ".join(f"{n!r}: {_gib(b)}" for b, n in shares[:5] if b)
            raise PlannerError(
                f"insufficient storage on rank {rank}: its shards of the dynamic tables "
                f"need {_gib(need)} of {memory} ({largest}), the topology gives "
                f"{_gib(budget)} ({cap}); lower max_capacity / global_hbm_for_values, "
                f"use a smaller embedding_dtype, or add ranks",
                PlannerErrorType.INSUFFICIENT_STORAGE,
            )


def _gib(n: int) -> str:
    return f"{n / (1 << 30):.3f} GiB"
