"""After a load, nothing the tables keep pins the checkpoint's files: the stats of the
load's last batch (``last_stats.failed_keys``) own their memory, not a view of a mapped
keys file, so no file stays mapped or open and the checkpoint can be unmounted."""

import gc
import os
from pathlib import Path

import pytest
import torch

from dynemb import (
    BatchedDynamicEmbeddingTables,
    DynamicEmbDump,
    DynamicEmbLoad,
    DynamicEmbScoreStrategy,
    DynamicEmbTableOptions,
)

pytestmark = pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="needs /proc")


def _module(strategy):
    options = DynamicEmbTableOptions(dim=4, max_capacity=256, score_strategy=strategy)
    return BatchedDynamicEmbeddingTables([options], [0], table_names=["t"])


def _held(directory: Path) -> list[str]:
    """Mappings and open descriptors of this process inside ``directory``."""
    inside = str(directory.resolve())
    held = [line.split()[-1] for line in open("/proc/self/maps") if inside in line]
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # the descriptor listdir itself used
            continue
        if target.startswith(inside):
            held.append(target)
    return held


@pytest.mark.parametrize(
    "strategy", [DynamicEmbScoreStrategy.TIMESTAMP, DynamicEmbScoreStrategy.NO_EVICTION]
)
def test_no_file_of_the_checkpoint_stays_mapped_or_open(tmp_path, strategy):
    trained = _module(strategy)
    trained(torch.arange(1, 65), torch.arange(65)).sum().backward()
    DynamicEmbDump(tmp_path / "ckpt", trained)
    loaded = _module(strategy)
    DynamicEmbLoad(tmp_path / "ckpt", loaded)
    gc.collect()
    assert _held(tmp_path / "ckpt") == []
    assert loaded.tables[0].last_stats.failed_keys.numel() == 0
    assert loaded.tables[0].size() == 64
