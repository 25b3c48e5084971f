"""Read-only dynamic tables for serving, exportable with ``torch.export``.

``InferenceEmbeddingCollection`` (DynamicEmb's name and constructor) and
``InferenceEmbeddingBagCollection`` look keys up in tables filled from a trained
(sharded) model or from a checkpoint written at any world size; keys not stored get
the tables' eval initializer, as a trained model's eval-mode lookup gives them. Nothing
is ever inserted, evicted or updated.

Export: each table's state is the tensors of the op argument ``table``
(``_ops.TABLE_TENSORS``), held as module buffers, so an exported program carries
them; the lookup is three dynemb ops (``table_find_slots``, ``embedding_pool``,
``embedding_gather``) whose fake kernels (dynemb/_fake_kernels.py) give output shapes
from input shapes, so tracing needs no data. Forward has no data-dependent shapes: each
table finds every key of the batch and the features it serves are cut out by position.
"""

import dataclasses
import threading
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import nn

from dynemb import _ops
from dynemb.config.table_options import DynamicEmbTableOptions
from dynemb.config.types import DynamicEmbPoolingMode
from dynemb.deltas import read_delta
from dynemb.deltas.replay import check_order, replayed_rows, served_tables, stored_rows
from dynemb.dump_files.format import CheckpointError
from dynemb.dump_files.manifest import MANIFEST, read_manifest
from dynemb.inference.arguments import (
    check_inference_batch,
    feature_map,
    pooling_mode_of,
)
from dynemb.inference.lookup import TableLookups
from dynemb.inference.quantize import FORMATS, check_weights_dtype, quantize_rows, row_bytes
from dynemb.inference.rows import (
    Rows,
    checkpoint_rows,
    frozen_table,
    gather_model_rows,
    quantized_table,
)
from dynemb.table.placement import BUFFERS, canonical_device
from dynemb.tbe.table_options import check_options, init_list, table_names_of

_OUTPUT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
# Serializes the writers of every module (loads, apply_delta); lookups take no lock:
# a writer builds new tables and swaps them in with one assignment (see _set_rows).
_WRITERS = threading.Lock()


class _TableBuffers(nn.Module):
    """One table's nine op tensors as buffers (names of dynemb.table.placement.BUFFERS),
    and for an 8-bit table ``rows``: the 8-bit row of each slot."""

    def __init__(self, tensors: Sequence[torch.Tensor], rows: torch.Tensor | None = None) -> None:
        super().__init__()
        self.set(tensors)
        if rows is not None:
            self.register_buffer("rows", rows)

    def set(self, tensors: Sequence[torch.Tensor]) -> None:
        for name, tensor in zip(BUFFERS, tensors, strict=True):
            self.register_buffer(name, tensor)

    def tensors(self) -> list[torch.Tensor]:
        return [getattr(self, name) for name in BUFFERS]


class InferenceEmbeddingCollection(nn.Module):
    """Read-only lookup of dynamic tables (DynamicEmb's ``exportable_tables`` module).

    Args:
        table_options: one DynamicEmbTableOptions per table (``dim`` and
            ``max_capacity`` required): the options the tables were trained with.
            ``max_capacity`` is this module's capacity per table (all ranks' rows; it
            grows when a load brings more); ``eval_initializer_args`` and ``seed`` give
            the rows of keys not stored; ``embedding_dtype`` the stored dtype.
        use_dynamic_hash: must be True (dynemb's tables are hash tables).
        pooling_mode: DynamicEmb's code (-1 none: one row per key; 1 sum; 2 mean) or
            a DynamicEmbPoolingMode. Default none (a sequence collection).
        table_names: names of the tables, each used once (default ``table_0``, ...): a
            load finds the trained tables (or the saved ones) by these names.
        feature_names: names of the features (default ``feature_0``, ...).
        feature_table_map: the table of each feature (default: feature i -> table i).
        output_dtype: float32, float16 or bfloat16.
        device: where the tables live (default CPU; CUDA in CUDA builds).
        key_type: torch.int64 (int32 keys are accepted too).
        weights_dtype: how rows are stored: None (default) as trained, in
            ``embedding_dtype``; ``torch.int8`` (8-bit rowwise: per row a float32 scale
            and bias, fbgemm's INT8 rows) or ``torch.float8_e4m3fn`` (e4m3 codes and a
            float32 scale per row), quantized as rows arrive (a load, each delta's
            rows) and dequantized in the pooling kernel. Error bounds:
            dynemb.inference.quantize.

    Raises:
        TypeError / ValueError: a bad argument, naming it and the value.

    Inputs follow fbgemm's TBE: ``keys`` feature-major, ``offsets`` (B * F + 1,) bag
    boundaries. Output: (n, dim) rows for no pooling, else (B, sum of feature dims).

    Example::

        >>> ec = InferenceEmbeddingCollection(
        ...     [DynamicEmbTableOptions(dim=4, max_capacity=1024)], table_names=["t0"])
        >>> ec.load_from_dynamicemb_file("/ckpt/step_1000")   # any world size
        >>> # 1 feature x B=2 bags: [[10, 11], [12]]
        >>> ec(torch.tensor([10, 11, 12]), torch.tensor([0, 2, 3])).shape
        torch.Size([3, 4])
        >>> program = torch.export.export(ec, (keys, offsets))
    """

    _default_pooling = -1

    def __init__(
        self,
        table_options: Sequence[DynamicEmbTableOptions],
        use_dynamic_hash: bool = True,
        pooling_mode: int | DynamicEmbPoolingMode | None = None,
        table_names: Sequence[str] | None = None,
        feature_names: Sequence[str] | None = None,
        feature_table_map: Sequence[int] | None = None,
        output_dtype: torch.dtype = torch.float32,
        device: str | torch.device | None = None,
        key_type: torch.dtype = torch.int64,
        weights_dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        check_weights_dtype(weights_dtype)
        options = list(table_options)
        if not options:
            raise ValueError("table_options must hold at least one DynamicEmbTableOptions")
        if use_dynamic_hash is not True:
            raise ValueError(
                f"use_dynamic_hash must be True (dynemb's tables are hash tables), got {use_dynamic_hash!r}"
            )
        names = table_names_of(table_names, len(options))
        for name, o in zip(names, options):
            check_options(name, o)
        fmap = feature_map(feature_names, feature_table_map, len(options))
        self.pooling_mode = pooling_mode_of(
            self._default_pooling if pooling_mode is None else pooling_mode
        )
        self._check_pooling(self.pooling_mode)
        if (
            self.pooling_mode == DynamicEmbPoolingMode.NONE
            and len({options[t].dim for t in fmap}) > 1
        ):
            raise ValueError(
                f"pooling_mode none needs one dim for every table, got dims {[o.dim for o in options]}"
            )
        if output_dtype not in _OUTPUT_DTYPES:
            raise ValueError(f"output_dtype must be one of {_OUTPUT_DTYPES}, got {output_dtype}")
        if key_type not in (torch.int64, torch.int32):
            raise ValueError(f"key_type must be torch.int64 or torch.int32, got {key_type}")
        self.table_options = options
        self.table_names = names
        self.feature_names = (
            list(feature_names)
            if feature_names is not None
            else [f"feature_{i}" for i in range(len(fmap))]
        )
        self.feature_table_map = fmap
        self.output_dtype = output_dtype
        self.device = canonical_device(device if device is not None else "cpu")
        self.weights_dtype = weights_dtype
        self.row_format = FORMATS[weights_dtype] if weights_dtype is not None else None
        empty = [frozen_table(o, None, self.device) for o in options]
        # Rows of keys not stored: the eval initializer for a table of the options'
        # capacity (a trained table's, so that its eval lookups and ours agree).
        self.missing = [init_list(o.eval_initializer_args, t) for o, t in zip(options, empty)]
        self.tables = nn.ModuleList(self._built(t, None)[0] for t in range(len(options)))
        self.sizes = [0] * len(options)
        # The delta chain: the base checkpoint's dump id and the last version applied
        # (None: not loaded from a dynemb checkpoint, no delta applies).
        self.base_dump_id: str | None = None
        self.delta_version: int | None = None
        # The base checkpoint's tables (``<collection>.<table>``): a delta names no other.
        self.base_tables: frozenset[str] = frozenset()

    # ------------------------------------------------------------------ loads

    def load_from_dynamicemb_file(
        self,
        save_dir: str | Path,
        table_names: Sequence[str] | None = None,
        collection: str | None = None,
    ) -> None:
        """Fills tables from a checkpoint directory written at any world size: dynemb's
        format or DynamicEmb's layout (DynamicEmbDump, or NVIDIA DynamicEmb's dump).

        Args:
            save_dir: the checkpoint directory.
            table_names: the tables to fill (default: all of this module's).
            collection: the checkpoint's collection holding them (``"ebc"``, or
                DynamicEmb's ``"model.ebc"``); default: the only one holding them all.

        Raises:
            CheckpointError / ValueError: as DynamicEmbLoad (missing or damaged files,
                dim / dtype / score strategy not the checkpoint's), an unknown table
                name, or no single collection holding the tables. Nothing changes then.
        """
        names = self._names(table_names)
        options = {n: self.table_options[self.table_names.index(n)] for n in names}
        rows = checkpoint_rows(save_dir, options, collection)
        manifest = read_manifest(Path(save_dir)) if (Path(save_dir) / MANIFEST).is_file() else None
        base = manifest["dump_id"] if manifest is not None else None
        with _WRITERS:
            self._swap_rows(rows, base, 0 if base is not None else None)
            self.base_tables = (
                frozenset(manifest["tables"]) if manifest is not None else frozenset()
            )

    def load_from_model(
        self,
        model: nn.Module,
        table_names: Sequence[str] | None = None,
        collection: str | None = None,
        pg=None,
    ) -> None:
        """Fills tables with the rows of a trained model's dynamic tables of the same
        names, gathered from every rank of ``pg`` (each rank gets all of them).

        Args:
            model: a (DMP-)sharded model or a BatchedDynamicEmbeddingTables.
            table_names: the tables to fill (default: all of this module's).
            collection: the model's collection path (e.g. ``"ebc"``) where several
                collections have tables of these names.
            pg: the model's process group (default: the world, or none).

        Raises:
            ValueError: a name that is not a dynamic table of the model, or ambiguous.
        """
        names = self._names(table_names)
        qualified = [f"{collection}.{n}" if collection else n for n in names]
        rows = gather_model_rows(model, qualified, pg)
        self._set_rows({n: rows[q] for n, q in zip(names, qualified)}, None, None)

    def apply_delta(self, path: str | Path, collection: str | None = None) -> int:
        """Applies a delta of dynemb.deltas.DeltaPublisher: its tombstoned keys are
        removed, its upserted rows stored. Deltas apply in version order onto the base
        checkpoint this module was loaded from (``load_from_dynamicemb_file``).

        Lookups go on meanwhile and never see a half-applied delta: the new tables are
        built aside (a copy of each served table's rows: time and memory in proportion
        to the table), then swapped in at once.

        Args:
            path: the delta directory (``<directory>/delta-<N>``).
            collection: the delta's collection holding this module's tables (as in
                ``load_from_dynamicemb_file``); default: the only one holding them.

        Returns:
            The delta's version, now ``delta_version``.

        Raises:
            CheckpointError: a missing or damaged delta file or manifest, naming it; a
                delta naming a table its base checkpoint does not hold, or whose content
                contradicts itself (see ``read_delta``).
            DeltaVersionError (a ValueError): the delta is not the next of the chain (a
                gap or a duplicate, naming both versions), or follows another base.
            ValueError: a table's dim or dtype is not this module's, or no collection
                holds the tables. Nothing changes on any error.

        Example::

            >>> ec.load_from_dynamicemb_file("/deltas/base")
            >>> ec.apply_delta("/deltas/delta-00000001")
            1
        """
        with _WRITERS:
            delta = read_delta(path)
            check_order(delta, self.delta_version, self.base_dump_id)
            unknown = sorted(set(delta.tables) - self.base_tables)
            if unknown:
                raise CheckpointError(
                    f"{delta.path}: tables {unknown} are not tables of its base checkpoint "
                    f"{self.base_dump_id!r} (which holds {sorted(self.base_tables)}); the delta "
                    "is not this chain's"
                )
            changes = served_tables(delta, self.table_names, collection)
            for name, change in changes.items():
                o = self.table_options[self.table_names.index(name)]
                dtype = o.embedding_dtype or torch.float32
                if change.dim != o.dim or change.values.dtype != dtype:
                    raise ValueError(
                        f"apply_delta({path}): table {name!r} has dim {change.dim} and dtype "
                        f"{change.values.dtype}, this module's has dim {o.dim} and dtype {dtype}"
                    )
            tables = self.tables
            rows = {}
            for name, change in changes.items():
                t = self.table_names.index(name)
                current = self._stored_rows(tables[t], self.table_options[t].dim)
                if self.weights_dtype is not None:  # only the delta's rows are quantized
                    values = quantize_rows(change.values, self.weights_dtype)
                    change = dataclasses.replace(change, values=values)
                rows[name] = replayed_rows(current, change)
            self._swap_rows(rows, self.base_dump_id, delta.version)
        return delta.version

    # ---------------------------------------------------------------- forward

    def forward(
        self,
        keys: torch.Tensor,
        offsets: torch.Tensor,
        pooling_offsets: torch.Tensor | None = None,
        per_sample_weights: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Looks a batch up; changes nothing.

        Args:
            keys: (n,) int64 (or int32) keys, feature-major.
            offsets: (B * F + 1,) int64 bag boundaries (F = number of features).
            pooling_offsets: must be None (the bags are ``offsets``).
            per_sample_weights: (n,) float32 weights (sum / mean pooling).

        Returns:
            (n, dim) rows without pooling; (B, sum of feature dims) pooled.
        """
        check_inference_batch(
            keys,
            offsets,
            pooling_offsets,
            per_sample_weights,
            device=self.device,
            num_features=len(self.feature_table_map),
            pooling_mode=self.pooling_mode,
        )
        keys = keys.to(torch.int64)
        offsets = offsets.to(torch.int64)
        features = len(self.feature_table_map)
        batch = (offsets.shape[0] - 1) // features
        used = sorted(set(self.feature_table_map))
        current = self.tables  # one state for the whole batch (apply_delta swaps it)
        tables = {t: current[t].tensors() for t in used}
        slots = {t: _ops.table_find_slots(tables[t], keys) for t in used}
        rows = {t: current[t].rows for t in used} if self.row_format is not None else None
        looked_up = TableLookups(
            tables, slots, self.feature_table_map, self.missing, self.table_options, batch,
            rows, self.row_format,
        )  # fmt: skip
        if self.pooling_mode == DynamicEmbPoolingMode.NONE:
            out = looked_up.sequence(keys, offsets)
        else:
            mean = self.pooling_mode == DynamicEmbPoolingMode.MEAN
            out = looked_up.pooled(keys, offsets, per_sample_weights, mean)
        return out.to(self.output_dtype)

    # ------------------------------------------------------------- internals

    def _set_rows(self, rows: dict[str, Rows], base: str | None, version: int | None) -> None:
        with _WRITERS:
            self._swap_rows(rows, base, version)

    def _swap_rows(self, rows: dict[str, Rows], base: str | None, version: int | None) -> None:
        """Builds the tables of ``rows`` aside, then swaps the module's table list in
        one assignment (a lookup keeps the list it started with). Holds _WRITERS."""
        built = {}
        for name, r in rows.items():  # every table built before any changes
            t = self.table_names.index(name)
            built[t] = self._built(t, r)
        sizes = list(self.sizes)
        tables = list(self.tables)
        for t, (buffers, size) in built.items():
            tables[t] = buffers
            sizes[t] = size
        self.tables = nn.ModuleList(tables)
        self.sizes = sizes
        self.base_dump_id, self.delta_version = base, version

    def _built(self, t: int, rows: Rows | None) -> tuple[_TableBuffers, int]:
        """Table t holding ``rows`` (None: empty), and its number of keys: float rows as
        trained, or 8-bit rows (float ones quantized, uint8 ones as they are)."""
        o = self.table_options[t]
        if self.weights_dtype is None:
            table = frozen_table(o, rows, self.device)
            return _TableBuffers(table.buffers.tensors()), table.size()
        q = quantized_table(o, rows, self.device, self.weights_dtype)
        return _TableBuffers(q.tensors, q.rows), q.size

    def _stored_rows(self, buffers: _TableBuffers, dim: int) -> Rows:
        """The stored keys and their rows: float embeddings, or 8-bit rows as stored."""
        tensors = buffers.tensors()
        if self.weights_dtype is None:
            return stored_rows(tensors, dim)
        width = row_bytes(self.weights_dtype, dim)
        tensors[4] = buffers.rows
        tensors[7] = buffers.rows.new_empty((0, width))
        return stored_rows(tensors, width)

    def _names(self, table_names) -> list[str]:
        if table_names is None:
            return list(self.table_names)
        unknown = [n for n in table_names if n not in self.table_names]
        if unknown:
            raise ValueError(
                f"table_names: {unknown} are not tables of this module ({self.table_names})"
            )
        return list(table_names)

    @staticmethod
    def _check_pooling(mode: DynamicEmbPoolingMode) -> None:
        """Any pooling suits the collection (DynamicEmb's pools too)."""


class InferenceEmbeddingBagCollection(InferenceEmbeddingCollection):
    """InferenceEmbeddingCollection that pools (sum by default, or mean): the
    counterpart of a trained EmbeddingBagCollection. Same arguments; ``pooling_mode``
    none is refused. Output: (B, sum of feature dims), features in order."""

    _default_pooling = 1

    @staticmethod
    def _check_pooling(mode: DynamicEmbPoolingMode) -> None:
        if mode == DynamicEmbPoolingMode.NONE:
            raise ValueError(
                "pooling_mode must be sum (1) or mean (2) for a bag collection, got none (-1)"
            )


__all__ = ["InferenceEmbeddingBagCollection", "InferenceEmbeddingCollection"]
