"""Checkpoints of dynamic tables: parallel dump, atomic commit, load at any world size."""

from dynemb.checkpoint.dump import DynamicEmbDump
from dynemb.checkpoint.exchange import CheckpointWarning
from dynemb.checkpoint.format import CheckpointError
from dynemb.checkpoint.load import DynamicEmbLoad
from dynemb.distributed.rank_faults import RankFailure

__all__ = [
    "CheckpointError",
    "CheckpointWarning",
    "DynamicEmbDump",
    "DynamicEmbLoad",
    "RankFailure",
]
