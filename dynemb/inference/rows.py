"""Where an inference module's rows come from: the tables of a trained (sharded) model,
gathered from every rank, or a checkpoint directory (dynemb's format or DynamicEmb's
layout) written at any world size, read by DynamicEmbLoad. Both end as ``(keys,
embeddings)`` per table, stored by ``frozen_table`` in a table that never evicts.
"""

import dataclasses
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import nn

from dynemb import _ops
from dynemb.checkpoint.exchange import RowsDroppedError
from dynemb.checkpoint.load import DynamicEmbLoad
from dynemb.checkpoint.tables import CollectionGroups, named_tables
from dynemb.config.table_options import DynamicEmbTableOptions
from dynemb.config.types import DynamicEmbScoreStrategy
from dynemb.distributed.collectives import all_gather, process_group
from dynemb.dump_files.dynamicemb_layout import is_dynamicemb_layout, saved_tables
from dynemb.dump_files.manifest import MANIFEST, read_manifest
from dynemb.inference.quantize import quantize_rows, row_bytes
from dynemb.table.scored_hash_table import ScoredHashTable
from dynemb.table_groups import ROOT_COLLECTION, collection_path
from dynemb.tbe.batched_dynamic_embedding_tables import BatchedDynamicEmbeddingTables

Rows = tuple[torch.Tensor, torch.Tensor]  # keys (n,) int64, embeddings (n, dim)


def table_rows(table: ScoredHashTable) -> Rows:
    """Every stored key of ``table`` and its embedding (no optimizer state)."""
    keys, values, _, _ = table.export_batch(0, max(1, table.capacity()))
    return keys, values


def frozen_table(
    options: DynamicEmbTableOptions, rows: Rows | None, device: torch.device
) -> ScoredHashTable:
    """A NO_EVICTION table holding ``rows`` (None: empty), for read-only lookups.

    Its capacity is ``options.max_capacity`` or, when the rows need more, the
    smallest doubling that stores every one of them: no row is ever evicted or lost.
    """
    keys, values = rows if rows is not None else (torch.empty(0, dtype=torch.int64), None)
    capacity = max(options.max_capacity, options.bucket_capacity, 2 * keys.numel())
    while True:
        table = ScoredHashTable(
            dim=options.dim,
            capacity=capacity,
            bucket_capacity=options.bucket_capacity,
            score_strategy=DynamicEmbScoreStrategy.NO_EVICTION,
            value_dtype=options.embedding_dtype or torch.float32,
            seed=options.seed,
            device=device,
        )
        if not keys.numel():
            return table
        stats = table.insert_or_assign(keys.to(device), values.to(device, table.value_dtype))
        if not stats.failed:
            return table
        capacity *= 2  # a bucket window overflowed: retry roomier


@dataclasses.dataclass(frozen=True)
class QuantizedTable:
    """A serving table of 8-bit rows: ``tensors``, the op tensors of a NO_EVICTION hash
    table of its keys (their ``values`` hold no column: never read), and ``rows``
    (num_slots, row_bytes) uint8, the 8-bit row of each slot (dynemb.inference.quantize)."""

    tensors: list
    rows: torch.Tensor
    size: int


def quantized_table(
    options: DynamicEmbTableOptions,
    rows: Rows | None,
    device: torch.device,
    weights_dtype: torch.dtype,
) -> QuantizedTable:
    """A QuantizedTable holding ``rows`` (None: empty): float embeddings are quantized
    here, uint8 ones (``row_bytes`` wide: rows already quantized) are stored as they are."""
    width = row_bytes(weights_dtype, options.dim)
    keys, values = rows if rows is not None else (torch.empty(0, dtype=torch.int64), None)
    if values is not None and values.dtype == torch.uint8:
        packed = values.cpu()
        if packed.dim() != 2 or packed.shape[1] != width:
            raise ValueError(f"8-bit rows must be (n, {width}) uint8, got {tuple(packed.shape)}")
    else:
        packed = quantize_rows(values, weights_dtype) if values is not None else None
    # The hash table of the keys only: its rows (one fp16 column while it is built) go.
    marker = dataclasses.replace(options, dim=1, embedding_dtype=torch.float16)
    markers = torch.zeros((keys.numel(), 1), dtype=torch.float16)
    table = frozen_table(marker, (keys, markers) if keys.numel() else None, device)
    tensors = list(table.buffers.tensors())
    num_slots = tensors[0].numel()
    by_slot = torch.zeros((num_slots, width), dtype=torch.uint8)
    if keys.numel():
        slots = _ops.table_find_slots(tensors, keys.to(device)).cpu()
        by_slot[slots] = packed
    tensors[4] = torch.empty((num_slots, 0), dtype=torch.float16, device=tensors[4].device)
    tensors[7] = torch.empty((0, 0), dtype=torch.float16, device=tensors[7].device)
    return QuantizedTable(tensors, by_slot.to(device), table.size())


def gather_model_rows(model: nn.Module, names: Sequence[str], pg=None) -> dict[str, Rows]:
    """Rows of the dynamic tables ``names`` of a trained model, from every rank of ``pg``.

    ``model``: a (DMP-)sharded model or a BatchedDynamicEmbeddingTables; a name is a
    table's name, or ``<collection path>.<table>`` where several collections use it.
    Every rank of ``pg`` must call it; each gets every row: a row-wise table's shards
    concatenated, a table-wise table's rank's rows, a column-wise table's slices joined
    by key (whole rows).

    Raises:
        ValueError: a name that is not a dynamic table of the model on any rank, or is
            ambiguous (on every rank).
    """
    pg = process_group(pg)
    tables = named_tables(model)
    matches = [[t for t in tables if t.name == n or t.name.endswith("." + n)] for n in names]
    mine = [
        (m[0].column_offset if m[0].is_slice else None, *table_rows(m[0].table))
        if len(m) == 1
        else None
        for m in matches
    ]
    ranks = all_gather((mine, [len(m) > 1 for m in matches]), pg)
    out = {}
    for i, name in enumerate(names):
        held = [rank_rows[i] for rank_rows, _ in ranks if rank_rows[i] is not None]
        ambiguous = any(rank_ambiguous[i] for _, rank_ambiguous in ranks)
        if not held or ambiguous:
            known = ", ".join(t.name for t in tables) or "none"
            why = "is ambiguous" if ambiguous else "is not a dynamic table of the model"
            raise ValueError(f"table_names: {name!r} {why} (dynamic tables: {known})")
        out[name] = _joined(name, held) if held[0][0] is not None else _concatenated(held)
    return out


def _concatenated(held: list) -> Rows:
    return torch.cat([h[1] for h in held]), torch.cat([h[2] for h in held])


def _joined(name: str, held: list) -> Rows:
    """Whole rows of a column-wise table's ``(first column, keys, columns)`` slices, by
    ascending key (every slice stores the same keys)."""
    slices = []
    for _, keys, values in sorted(held, key=lambda h: h[0]):
        order = torch.argsort(keys)
        slices.append((keys[order], values[order]))
    keys = slices[0][0]
    if any(not torch.equal(k, keys) for k, _ in slices[1:]):
        raise RuntimeError(f"the column slices of table {name!r} hold different keys")
    return keys, torch.cat([v for _, v in slices], dim=1)


def checkpoint_rows(
    path: str | Path,
    options: dict[str, DynamicEmbTableOptions],
    collection: str | None = None,
) -> dict[str, Rows]:
    """Rows of tables ``options`` (name -> the options they were trained with) from a
    checkpoint directory written at any world size (read in this process alone).

    Args:
        path: a checkpoint of DynamicEmbDump (dynemb's format or DynamicEmb's layout)
            or of NVIDIA DynamicEmb.
        options: the tables to read, with their training options (dim, dtype and
            score strategy must match the checkpoint's; ``dist_type`` tells how
            DynamicEmb's ``continuous`` ids map to keys).
        collection: the collection of the checkpoint that holds them (``"ebc"`` or
            DynamicEmb's ``"model.ebc"``); default: the one collection holding every
            table named.

    Raises:
        CheckpointError / ValueError: as DynamicEmbLoad, and when no (or more than one)
            collection holds every table.
    """
    path = Path(path)
    names = list(options)
    inner = _collection(path, names, collection)
    capacities = [o.max_capacity for o in options.values()]
    while True:  # a table too small for the checkpoint: load again, twice as roomy
        group = BatchedDynamicEmbeddingTables(
            [
                dataclasses.replace(o, training=False, max_capacity=c)
                for o, c in zip(options.values(), capacities, strict=True)
            ],
            feature_table_map=list(range(len(names))),
            table_names=names,
        )
        groups = CollectionGroups({inner: group})
        try:
            DynamicEmbLoad(path, groups, table_names=_qualified(inner, names), strict=True)
        except RowsDroppedError:
            capacities = [2 * c for c in capacities]
            continue
        return {t.table_name: table_rows(t.table) for t in named_tables(group)}


def _qualified(inner: str, names: Sequence[str]) -> list[str]:
    return [f"{inner}.{n}" if inner else n for n in names]


def _collection(path: Path, names: Sequence[str], wanted: str | None) -> str:
    """The collection path (without DynamicEmb's ``model`` prefix) holding ``names``."""
    if (path / MANIFEST).is_file() or not is_dynamicemb_layout(path):
        saved = {_split(name) for name in read_manifest(path)["tables"]}
    else:
        saved = {(collection_path(_inner(c)), t) for c, t in saved_tables(path)}
    holding = sorted({c for c, _ in saved if all((c, n) in saved for n in names)})
    if wanted is not None:
        inner = _inner(wanted)
        if inner not in holding:
            raise ValueError(
                f"collection={wanted!r}: the checkpoint {path} has no collection holding "
                f"tables {list(names)} (collections holding them: {holding})"
            )
        return inner
    if len(holding) != 1:
        raise ValueError(
            f"{path}: {len(holding)} collections hold tables {list(names)} ({holding}); "
            "pass collection= to choose one"
        )
    return holding[0]


def _split(name: str) -> tuple[str, str]:
    collection, _, table = name.rpartition(".")
    return collection, table


def _inner(path: str) -> str:
    """``"model.ebc"`` (DynamicEmb's) -> ``"ebc"``; ``"model"`` -> ``""``; others unchanged."""
    if path == ROOT_COLLECTION:
        return ""
    prefix = ROOT_COLLECTION + "."
    return path[len(prefix) :] if path.startswith(prefix) else path


__all__ = [
    "QuantizedTable",
    "checkpoint_rows",
    "frozen_table",
    "gather_model_rows",
    "quantized_table",
    "table_rows",
]
