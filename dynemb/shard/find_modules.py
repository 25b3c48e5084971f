"""DynamicEmb's helpers that find the sharded collections and the dynamic-table modules
of a model (``dynemb.dump_load`` re-exports them with DynamicEmbDump / DynamicEmbLoad)."""

from torch import nn
from torchrec.distributed.embedding import ShardedEmbeddingCollection
from torchrec.distributed.embeddingbag import ShardedEmbeddingBagCollection

from dynemb.table_groups import ROOT_COLLECTION, collection_path, table_groups

_SHARDED_TYPES = (ShardedEmbeddingBagCollection, ShardedEmbeddingCollection)


def find_sharded_modules(module: nn.Module, path: str = "") -> list[tuple[str, str, nn.Module]]:
    """Every TorchRec sharded collection (``ShardedEmbeddingBagCollection`` /
    ``ShardedEmbeddingCollection``, dynemb's included) inside ``module``.

    Args:
        module: a model (DMP / DDP wrappers are looked through) or a sharded collection.
        path: the name of ``module`` itself in the paths returned (default ``"model"``).

    Returns:
        ``[(path, name, sharded module)]`` in module order: ``path`` is
        ``"<path>.<attribute path>"`` without wrapper levels (``"model"`` for the model
        itself), ``name`` its last attribute (``"model"`` for the model itself); the
        paths are those of ``get_score`` and of the checkpoint directories.

    Example::

        find_sharded_modules(dmp_model)  # [("model.sparse.ebc", "ebc", <ShardedEBC>)]
    """
    root = path or ROOT_COLLECTION
    found = []
    for attr_path, child in module.named_modules():
        if isinstance(child, _SHARDED_TYPES):
            inner = collection_path(attr_path)
            full = f"{root}.{inner}" if inner else root
            found.append((full, full.rsplit(".", 1)[-1], child))
    return found


def get_dynamic_emb_module(model: nn.Module) -> list[nn.Module]:
    """The dynamic-table modules (``BatchedDynamicEmbeddingTablesV2``, one per group of
    tables) of ``model`` on this rank, in module order: those inside its sharded
    collections, and those it holds as submodules (dynemb.table_groups finds them).

    Example::

        for tables in get_dynamic_emb_module(dmp_model):
            print(tables.table_names, tables.get_score())
    """
    return [group for _, group in table_groups(model)]


__all__ = ["find_sharded_modules", "get_dynamic_emb_module"]
