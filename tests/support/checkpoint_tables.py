"""Small single-process tables for the checkpoint robustness tests: build, train, compare."""

import json
from pathlib import Path

import torch

from dynemb import BatchedDynamicEmbeddingTables, DynamicEmbScoreStrategy, DynamicEmbTableOptions
from dynemb.dump_files.manifest import checksum
from dynemb.optimizer import EmbOptimType


def make_module(dim: int = 8, capacity: int = 1 << 12, optimizer=EmbOptimType.ADAM):
    """Two tables, ``a`` (LFU) and ``b`` (TIMESTAMP), one feature each."""
    options = [
        DynamicEmbTableOptions(
            dim=dim, max_capacity=capacity, score_strategy=DynamicEmbScoreStrategy.LFU
        ),
        DynamicEmbTableOptions(dim=dim, max_capacity=capacity),
    ]
    return BatchedDynamicEmbeddingTables(
        options, [0, 1], optimizer=optimizer, table_names=["a", "b"]
    )


def train(module, keys) -> None:
    """One step over 2 features of len(keys) / 2 single-id bags each."""
    keys = torch.as_tensor(keys, dtype=torch.int64)
    offsets = torch.arange(keys.numel() + 1)
    module(keys, offsets).sum().backward()


def contents(module) -> list:
    """Per table: (keys, rows with optimizer state, scores), sorted by key."""
    out = []
    for table in module.tables:
        keys, rows, scores, _ = table.export_batch(0, table.capacity(), include_extra=True)
        order = torch.argsort(keys)
        out.append((keys[order], rows[order], scores[order]))
    return out


def same(a, b) -> bool:
    return all(
        torch.equal(x, y) for ta, tb in zip(a, b, strict=True) for x, y in zip(ta, tb, strict=True)
    )


def edit_manifest(path: Path, edit, rehash: bool = True) -> None:
    """Applies ``edit`` to the manifest's JSON; with ``rehash`` fixes its checksum, as a
    hostile writer would (the schema must then catch the edit)."""
    file = Path(path) / "manifest.json"
    manifest = json.loads(file.read_text())
    edit(manifest)
    if rehash:
        manifest["checksum"] = checksum(manifest)
    file.write_text(json.dumps(manifest))
