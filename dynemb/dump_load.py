"""DynamicEmb's ``dynamicemb.dump_load``: checkpoints (``DynamicEmbDump`` /
``DynamicEmbLoad``, dynemb.checkpoint's), and the helpers that find the sharded
collections and dynamic-table modules of a model.

A front module: it re-exports names defined in dynemb's packages and no module of
dynemb imports it.
"""

from dynemb.checkpoint import DynamicEmbDump, DynamicEmbLoad
from dynemb.shard.find_modules import find_sharded_modules, get_dynamic_emb_module

__all__ = ["DynamicEmbDump", "DynamicEmbLoad", "find_sharded_modules", "get_dynamic_emb_module"]
