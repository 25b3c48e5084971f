"""What ``example.py --publish_every K`` writes, and how ``examples/serve.py`` finds it.

A publish directory holds one chain of versions::

    example.json            the example's arguments (serve.py rebuilds the model from them)
    base/                   version 0 of the dynamic tables: a DynamicEmbDump checkpoint
    delta-<N, 8 digits>/    versions 1, 2, ...: dynemb.deltas.DeltaPublisher's deltas
    dense-<N, 8 digits>.pt  version N of everything else (torch.save of a dict of tensors):
                            the dense MLPs and the ordinary TorchRec tables, whole

Version N of the model is ``base`` + ``delta-1`` .. ``delta-N`` + ``dense-N.pt``. Each
file appears whole or not at all: the deltas and the base are committed by a rename (see
dynemb.deltas), and ``dense-N.pt`` is written to a hidden temporary file, fsynced and
renamed. ``dense-N.pt`` is written before ``delta-N``, so a version is complete once
its delta (or the base) exists; ``published_versions`` lists only complete ones.

Deltas cover the dynamic tables only: ``dense-N.pt`` holds the ordinary tables whole
(``--vocab_size`` rows each, 64 MB per version at the default sizes; none with
``--optimizer ADAM`` on CPU, where every table is dynamic).
"""

import json
import os
import re
import warnings
from pathlib import Path

import torch
from torch import nn
from torch.distributed._shard.sharded_tensor import ShardedTensor

from dynemb.checkpoint.format import fsync_dir
from dynemb.deltas import DeltaPublisher, delta_path

CONFIG = "example.json"
_DENSE = re.compile(r"^dense-(\d{8})\.pt$")


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


def dense_state(dlrm: nn.Module, dynamic_tables: set[str]) -> dict[str, torch.Tensor]:
    """Every tensor of the (single-process) model's state but the dynamic tables, as
    plain CPU tensors: the dense MLPs and the ordinary tables' weights (a one-process
    ShardedTensor holds its whole table in its one shard)."""
    state = {}
    for name, value in dlrm.state_dict().items():
        if any(f".{table}." in f".{name}" for table in dynamic_tables):
            continue
        if isinstance(value, ShardedTensor):
            with warnings.catch_warnings():  # TorchRec's ordinary tables are ShardedTensors
                warnings.simplefilter("ignore", FutureWarning)
                shards = value.local_shards()
                size = value.size()
            if len(shards) != 1 or shards[0].tensor.shape != size:
                raise ValueError(f"{name}: not a whole table in one shard ({size})")
            value = shards[0].tensor
        state[name] = value.detach().to("cpu", copy=True)
    return state


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
        model: the single-process DMP model of example.py.
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
        _save_json_atomically(config, self.directory / CONFIG)
        self.steps = 0  # since the last version

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
        state = dense_state(self.model.module, self.dynamic_tables)
        save_atomically(state, dense_path(self.directory, version))


def _save_json_atomically(obj: dict, path: Path) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        tmp.write_text(json.dumps(obj, indent=1, sort_keys=True))
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
