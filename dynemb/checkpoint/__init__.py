"""Checkpoints of dynamic tables: parallel dump, atomic commit, load at any world size."""

from dynemb.checkpoint.exchange import CheckpointWarning
from dynemb.checkpoint.load import DynamicEmbLoad
from dynemb.checkpoint.writer import DynamicEmbDump
from dynemb.distributed.rank_faults import RankFailure
from dynemb.dump_files.format import CheckpointError

__all__ = [
    "CheckpointError",
    "CheckpointWarning",
    "DynamicEmbDump",
    "DynamicEmbLoad",
    "RankFailure",
]
