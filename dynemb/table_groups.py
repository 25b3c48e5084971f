"""The one walk over a model that finds its groups of dynamic tables, and their names.

A module that holds groups of dynamic tables says so by a method,
``dynamic_table_groups()`` (the ``HoldsTableGroups`` protocol): a
``BatchedDynamicEmbeddingTables`` answers itself, a sharded collection the groups of its
kernels (TorchRec keeps those in a plain list, out of ``nn.Module.modules()``'s reach),
a ``CollectionGroups`` the groups it was given. ``table_groups`` walks any model
(``DistributedModelParallel``, ``DistributedDataParallel``, a plain module, one group)
and asks every module; checkpoints, incremental dumps, telemetry and the sharded
modules' helpers find tables through it, never by class.
"""

from collections.abc import Iterable
from typing import Protocol

from torch import nn

__all__ = [
    "ROOT_COLLECTION",
    "HoldsTableGroups",
    "collection_path",
    "public_collection_path",
    "table_groups",
]


class HoldsTableGroups(Protocol):
    """A module holding groups of dynamic tables (``BatchedDynamicEmbeddingTables``)."""

    def dynamic_table_groups(self) -> Iterable[tuple[str, nn.Module]]:
        """``(path below this module, group)`` of each group it holds (``""``: at it)."""
        ...


def table_groups(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """``(module path, group)`` of every group of dynamic tables of ``model`` on this rank,
    in module order, each group once (at the first module that holds it). The path is
    ``model.named_modules()``'s, wrapper levels included (``collection_path`` drops them).

    Raises:
        TypeError: ``model`` is not a ``torch.nn.Module``.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    seen: set[int] = set()
    found = []
    for path, module in model.named_modules():
        if getattr(type(module), "dynamic_table_groups", None) is None:
            continue
        for below, group in module.dynamic_table_groups():
            if id(group) not in seen:
                seen.add(id(group))
                found.append((".".join(p for p in (path, below) if p), group))
    return found


_WRAPPERS = ("_dmp_wrapped_module", "module")  # DMP / DDP wrappers: not part of a name


def collection_path(path: str) -> str:
    """A module path without DMP / DDP wrapper levels, so that a collection (and its
    tables) has the same name wrapped or not, at any world size."""
    parts = path.split(".") if path else []
    while parts and parts[0] in _WRAPPERS:
        parts.pop(0)
    return ".".join(parts)


ROOT_COLLECTION = "model"
"""DynamicEmb's path of the model itself; a collection inside it is ``model.<path>``."""


def public_collection_path(path: str) -> str:
    """DynamicEmb's name of a collection: ``"model"`` for the model itself, else
    ``"model.<module path without DMP / DDP wrapper levels>"``.

    Example::

        public_collection_path("module.sparse.ebc")  # "model.sparse.ebc" (DMP's "module")
    """
    inner = collection_path(path)
    return f"{ROOT_COLLECTION}.{inner}" if inner else ROOT_COLLECTION
