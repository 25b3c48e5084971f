"""The few collectives that checkpoints, incremental dumps, deltas and inference
modules need, over a process group or one process alone."""

import torch.distributed as dist

from dynemb.distributed.rank_faults import collective


def process_group(pg):
    """The group to work over, or None for a single process."""
    if pg is not None:
        return pg
    return dist.group.WORLD if dist.is_available() and dist.is_initialized() else None


def rank_and_size(pg) -> tuple[int, int]:
    """``(rank, world size)`` in ``pg`` (``(0, 1)`` for None)."""
    return (dist.get_rank(pg), dist.get_world_size(pg)) if pg is not None else (0, 1)


def all_gather(obj, pg) -> list:
    """Every rank's ``obj``, in rank order (``[obj]`` for None); inside a RankAgreement,
    a rank that failed or died makes it raise RankFailure instead of waiting."""
    if pg is None:
        return [obj]
    out = [None] * dist.get_world_size(pg)
    collective(lambda: dist.all_gather_object(out, obj, group=pg))
    return out


__all__ = ["all_gather", "process_group", "rank_and_size"]
