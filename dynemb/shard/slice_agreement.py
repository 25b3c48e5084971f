"""The slices of a column-wise dynamic table, checked for agreement every training forward.

Every slice runs the same lookups on the same keys (cw_sharding.py says why), so a
batch's lookup has the same outcome on each slice: the same keys already stored, new,
evicting or failed. A slice that lost keys the others hold (erased on one rank only,
or slices loaded from different checkpoints) breaks that silently: the forward then
joins its fresh columns with the other slices' trained ones, and a dump refuses the
table only later. So, for each column-wise dynamic table whose ``safe_check_mode`` is
ERROR or WARNING, the ranks compare each slice's lookup outcome counts of the batch
(``BatchedDynamicEmbeddingTables.lookup_outcomes``: hits, inserted, evicted, failed)
in one all-reduce per forward of the sharding, and report a difference by that mode.

What it sees: a batch whose lookup has a different outcome on one slice (a key stored
in some slices only is a hit there and new in the others). What it does not: slices
that differ in keys this batch does not touch (found when a batch touches them, or by
the dump), and two slices' differences that cancel in the counts of one batch. Not
checked: tables in safe_check_mode IGNORE (no collective is added to their forwards),
eval forwards (no lookup inserts), and caching tables (a slice's cache holds its width's
share of ``local_hbm_for_values``, so cache hits may legitimately differ).
"""

import warnings

import torch
import torch.distributed as dist
from torchrec.distributed.embedding_sharding import EmbeddingShardingInfo
from torchrec.distributed.types import ShardingEnv

from dynemb.config.types import DynamicEmbCheckMode
from dynemb.tbe.batched_dynamic_embedding_tables import BatchedDynamicEmbeddingTables

_COUNTS = ("hits", "inserted", "evicted", "failed")


class SliceAgreement:
    """The agreement check of one column-wise sharding's dynamic tables (every rank
    builds one, from the same sharding infos, and calls ``check`` in every forward).

    Args:
        infos: the sharding's tables (every rank's: the plan is global).
        env: the sharding's environment (its process group and this rank).
        device: where the all-reduce's tensor lives (the process group's device).
    """

    def __init__(self, infos: list[EmbeddingShardingInfo], env: ShardingEnv, device=None):
        self._names: list[str] = []
        self._modes: list[DynamicEmbCheckMode] = []
        for info in infos:
            options = getattr(info.param_sharding, "dynamicemb_options", None)
            if options is None or options.caching:
                continue
            if options.safe_check_mode == DynamicEmbCheckMode.IGNORE:
                continue
            self._names.append(info.embedding_config.name)
            self._modes.append(options.safe_check_mode)
        self._pg = env.process_group
        self._rank = env.rank
        self._world = env.world_size
        self._device = device if device is not None else torch.device("cpu")
        self._modules: list[BatchedDynamicEmbeddingTables] = []

    @property
    def checked_tables(self) -> list[str]:
        """The tables compared (column-wise, dynamic, safe_check_mode ERROR or WARNING,
        not caching), in the same order on every rank."""
        return list(self._names)

    def add(self, module: BatchedDynamicEmbeddingTables) -> None:
        """Registers a kernel's tables of this rank (the slices it holds)."""
        self._modules.append(module)

    def check(self) -> None:
        """Compares the slices' outcomes of this forward's lookups (a collective: every
        rank of the sharding's process group calls it, in training forwards only).

        Raises:
            RuntimeError: a table in safe_check_mode ERROR whose slices disagree (on
                every rank; this batch's lookups have already run). WARNING tables
                warn instead.
        """
        if not self._names:
            return
        index = {name: i for i, name in enumerate(self._names)}
        # [rank, table] = (holds a slice that looked the batch up, *counts): each rank
        # writes its own row, the sum gathers them.
        table = torch.zeros(self._world, len(self._names), 1 + len(_COUNTS), dtype=torch.int64)
        for module in self._modules:
            for name, outcome in zip(module.table_names, module.lookup_outcomes, strict=True):
                i = index.get(name)
                if i is not None and outcome is not None:
                    table[self._rank, i] = torch.tensor((1, *outcome))
        gathered = table.to(self._device)
        dist.all_reduce(gathered, group=self._pg)
        gathered = gathered.cpu()
        errors = []
        for i, (name, mode) in enumerate(zip(self._names, self._modes, strict=True)):
            seen = {r: tuple(gathered[r, i, 1:].tolist()) for r in range(self._world)
                    if gathered[r, i, 0]}  # fmt: skip
            if len(set(seen.values())) <= 1:
                continue
            message = _disagreement(name, seen, mode)
            if mode == DynamicEmbCheckMode.ERROR:
                errors.append(message)
            else:
                warnings.warn(message, stacklevel=3)
        if errors:
            raise RuntimeError("; ".join(errors))


def _disagreement(name: str, seen: dict, mode: DynamicEmbCheckMode) -> str:
    by_rank = ", ".join(
        f"rank {r}: " + " ".join(f"{k}={v}" for k, v in zip(_COUNTS, counts, strict=True))
        for r, counts in seen.items()
    )
    done = (
        "this batch's lookups have run" if mode == DynamicEmbCheckMode.ERROR else "training goes on"
    )
    return (
        f"column-wise dynamic table {name!r}: its slices disagree on the keys of this batch "
        f"(lookup outcomes {by_rank}): a slice lost keys the others hold (erased on one rank "
        f"only, or slices loaded from different checkpoints), so the outputs join columns of "
        f"a trained row with those of a new one; safe_check_mode {mode.name}: {done}. Load "
        f"every slice from one checkpoint (DynamicEmbLoad), or erase keys from every slice"
    )


__all__ = ["SliceAgreement"]
