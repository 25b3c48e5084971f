"""What ``example.py --publish_every K`` writes, and how ``examples/serve.py`` reads it.

A publish directory holds one chain of versions::

    example.json            the example's arguments (serve.py rebuilds the model from them)
    base/                   version 0 of the dynamic tables: a DynamicEmbDump checkpoint
    delta-<N, 8 digits>/    versions 1, 2, ...: dynemb.deltas.DeltaPublisher's deltas
    dense-<N, 8 digits>.pt  version N of everything else (torch.save of a dict):
                            {"dense": {name: tensor}, the dense layers whole,
                             "tables": {name: (rows, values)}, each ordinary TorchRec
                             table's rows that changed since version N - 1 (int64 row
                             indices, their values; rows None at version 0: the whole table)}

Version N of the model is ``base`` + ``delta-1`` .. ``delta-N`` for the dynamic tables,
``dense-0`` .. ``dense-N`` for the ordinary tables (``read_version``), ``dense-N`` for the
dense layers. So a version costs what training touched, ordinary tables included. Each
file appears whole or not at all: the deltas and the base are committed by a rename
(see dynemb.deltas), and ``dense-N.pt`` is written to a hidden temporary file, fsynced
and renamed. ``dense-N.pt`` is written before ``delta-N``, so a version is complete once
its delta (or the base) exists; ``published_versions`` lists only complete ones.
"""

import hashlib
import json
import os
import re
import warnings
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed._shard.sharded_tensor import ShardedTensor

from dynemb.deltas import DeltaPublisher, delta_path
from dynemb.dump_files.format import fsync_dir

CONFIG = "example.json"
_DENSE = re.compile(r"^dense-(\d{8})\.pt$")
_DELTA = re.compile(r"^delta-(\d{8})$")


class PublishedFileError(ValueError):
    """A file of a published version is missing or cannot be read; the message names it."""


def dense_path(directory: str | Path, version: int) -> Path:
    """``<directory>/dense-<version, 8 digits>.pt``."""
    return Path(directory) / f"dense-{version:08d}.pt"


def read_config(directory: str | Path) -> dict:
    """The example's arguments, as ``example.json`` holds them."""
    return json.loads((Path(directory) / CONFIG).read_text())


def published_versions(directory: str | Path) -> list[int]:
    """The complete versions of ``directory``, ascending: 0 (base), 1, 2, ... up to the
    first one missing its dynamic part or its dense part."""
    directory = Path(directory)
    dense = {int(m.group(1)) for p in directory.iterdir() if (m := _DENSE.match(p.name))}
    versions = []
    while len(versions) in dense:
        v = len(versions)
        if not (directory / "base" if v == 0 else delta_path(directory, v)).is_dir():
            break
        versions.append(v)
    return versions


def latest_version(directory: str | Path) -> int | None:
    """The last version committed to ``directory``: its highest delta (0: the base
    alone), whether or not every version before it is whole (``missing_files``); None
    when neither the base nor a delta exists. A ``dense-N.pt`` without its delta is a
    publication in progress, not a version."""
    directory = Path(directory)
    deltas = [int(m.group(1)) for p in directory.iterdir() if (m := _DELTA.match(p.name))]
    deltas = [v for v in deltas if delta_path(directory, v).is_dir()]
    if deltas:
        return max(deltas)
    return 0 if (directory / "base").is_dir() else None


def missing_files(directory: str | Path, version: int) -> list[str]:
    """The files that version ``version`` of ``directory`` needs and that are absent, by
    name (``base/``, ``delta-<N>/``, ``dense-<N>.pt``): the base, deltas 1..version and
    dense files 0..version. Empty when the version is whole."""
    directory = Path(directory)
    needed = [directory / "base"] + [delta_path(directory, v) for v in range(1, version + 1)]
    missing = [f"{path.name}/" for path in needed if not path.is_dir()]
    dense = [dense_path(directory, v) for v in range(version + 1)]
    return missing + [path.name for path in dense if not path.is_file()]


TABLES = ("embedding_bag_collection.", "embedding_collection.")  # SequenceDLRM's collections

State = tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]


def model_state(dlrm: nn.Module, dynamic_tables: set[str]) -> State | None:
    """(dense layers, ordinary tables' weights) of the model, as plain CPU copies, on
    rank 0 (None on the others); the dynamic tables are left out (their placeholders
    too). A TorchRec table is a ShardedTensor: gathered whole to rank 0 (a collective:
    every rank calls this). The dense layers are the same on every rank (DDP): checked.
    """
    rank = dist.get_rank() if dist.is_initialized() else 0
    dense, tables = {}, {}
    for name, value in dlrm.state_dict().items():
        if any(f".{table}." in f".{name}" for table in dynamic_tables):
            continue
        if isinstance(value, ShardedTensor):
            with warnings.catch_warnings():  # TorchRec's ordinary tables are ShardedTensors
                warnings.simplefilter("ignore", FutureWarning)
                value = _whole_on_rank0(value, rank)
            if value is None:
                continue
        copy = value.detach().to("cpu", copy=True)
        (tables if name.startswith(TABLES) else dense)[name] = copy
    _check_same_on_every_rank(dense)
    return (dense, tables) if rank == 0 else None


def _whole_on_rank0(value: ShardedTensor, rank: int) -> torch.Tensor | None:
    """The whole table on rank 0 (None on the others): one process's one shard, or
    gathered over the ranks (all of them, whichever rank holds the shards)."""
    shards, size = value.local_shards(), value.size()
    if not dist.is_initialized() or dist.get_world_size() == 1:
        if len(shards) != 1 or shards[0].tensor.shape != size:
            raise ValueError(f"not a whole table in one shard ({size})")
        return shards[0].tensor
    whole = torch.empty(size, dtype=value.dtype) if rank == 0 else None
    value.gather(dst=0, out=whole)
    return whole


def _check_same_on_every_rank(dense: dict[str, torch.Tensor]) -> None:
    """Raises RuntimeError unless every rank's dense layers are the same bytes (rank 0
    writes them for all)."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return
    digest = hashlib.sha256()
    for name in sorted(dense):
        digest.update(name.encode())
        digest.update(dense[name].reshape(-1).view(torch.uint8).numpy().tobytes())
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, digest.hexdigest())
    differ = [r for r, d in enumerate(everyone) if d != everyone[0]]
    if differ:
        raise RuntimeError(
            f"ExamplePublisher: the dense layers of ranks {differ} differ from rank 0's; "
            "rank 0 publishes them for every rank"
        )


def changed_rows(previous: torch.Tensor, current: torch.Tensor) -> torch.Tensor:
    """(m,) int64 indices of the rows of ``current`` whose bytes differ from
    ``previous``'s (bytes, not values: -0.0 vs 0.0 and NaNs are changes too)."""
    rows = current.shape[0]
    before = previous.contiguous().view(torch.uint8).reshape(rows, -1)
    after = current.contiguous().view(torch.uint8).reshape(rows, -1)
    return torch.nonzero((before != after).any(dim=1), as_tuple=True)[0]


def read_version(directory: str | Path, version: int) -> State:
    """(dense layers, ordinary tables) of ``version``: ``dense-N``'s dense layers, and
    the tables of ``dense-0`` patched with the changed rows of ``dense-1`` .. ``dense-N``.

    Raises:
        PublishedFileError: one of these files is missing or cannot be read, naming it.
    """
    dense, tables = {}, {}
    for v in range(version + 1):
        path = dense_path(directory, v)
        try:
            saved = torch.load(path, weights_only=True)
            dense = saved["dense"]
            for name, (rows, values) in saved["tables"].items():
                if rows is None:
                    tables[name] = values
                else:
                    tables[name][rows] = values
        except Exception as e:  # any damage: a truncated zip, a bad pickle, another layout
            reason = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise PublishedFileError(
                f"{path}: cannot read version {v}'s dense state ({reason}); the file is "
                "missing or damaged"
            ) from e
    return dense, tables


def save_atomically(obj, path: Path) -> None:
    """torch.save to a hidden temporary file in the same directory, fsync, rename."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fsync_dir(path.parent)
    finally:
        tmp.unlink(missing_ok=True)


class ExamplePublisher:
    """A DeltaPublisher over the model's dynamic tables, plus the dense state of each
    version and the arguments that rebuild the model (see the module docstring).

    Args:
        model: the DMP model of example.py, over one process or several (every rank
            creates the publisher and publishes at the same steps; rank 0 writes).
        directory: the publish directory (created; must hold no version yet).
        every: publish a version every ``every`` training steps (``after_step``).
        dynamic_tables: names of the dynamic tables (left out of ``dense-N.pt``).
        config: the example's arguments, written to ``example.json``.
    """

    def __init__(
        self,
        model: nn.Module,
        directory: str | Path,
        every: int,
        dynamic_tables: set[str],
        config: dict,
    ) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.model = model
        self.every = every
        self.dynamic_tables = dynamic_tables
        self.deltas = DeltaPublisher(model, self.directory)
        self.lead = not dist.is_initialized() or dist.get_rank() == 0
        if self.lead:
            _save_json_atomically(config, self.directory / CONFIG)
        self.steps = 0  # since the last version
        self.tables: dict[str, torch.Tensor] = {}  # the ordinary tables as last published

    @property
    def version(self) -> int | None:
        """The last version published (None before the base)."""
        return self.deltas.version

    def publish_base(self) -> int:
        """Version 0: the dense state, then the base checkpoint (its commit point)."""
        self._save_dense(0)
        return self.deltas.publish_base()

    def after_step(self) -> None:
        """Called after each optimizer step: publishes every ``every`` steps."""
        self.steps += 1
        if self.steps == self.every:
            self.publish()

    def publish_pending(self) -> int:
        """Publishes the steps since the last version, if any; returns the version."""
        if self.steps:
            self.publish()
        return self.version

    def publish(self) -> int:
        """The next version: the dense state, then the delta (its commit point)."""
        self._save_dense(self.deltas.version + 1)
        version = self.deltas.publish()
        self.steps = 0
        return version

    def close(self) -> None:
        self.deltas.close()

    def _save_dense(self, version: int) -> None:
        """Every rank takes part (the ordinary tables are gathered); rank 0 writes."""
        state = model_state(self.model.module, self.dynamic_tables)
        if state is None:  # not rank 0
            return
        dense, tables = state
        if version == 0:
            patches = {name: (None, weight) for name, weight in tables.items()}
        else:
            patches = {}
            for name, weight in tables.items():
                rows = changed_rows(self.tables[name], weight)
                patches[name] = (rows, weight[rows])
        save_atomically(dict(dense=dense, tables=patches), dense_path(self.directory, version))
        self.tables = tables


def _save_json_atomically(obj: dict, path: Path) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        tmp.write_text(json.dumps(obj, indent=1, sort_keys=True))
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
