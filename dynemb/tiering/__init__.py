"""Caching mode: a fast cache table in front of a slow ``Storage`` (see DynamicEmb_APIs.md)."""

from dynemb.config.storage import Storage, StorageSpec
from dynemb.tiering.backing import HashTableStorage, make_backing_storage
from dynemb.tiering.cache import Cache
from dynemb.tiering.cached_table import CachedTable, CacheStats
from dynemb.tiering.pipeline import (
    DistributedInput,
    PrefetchPipeline,
    distribute_for_prefetch,
    prefetch_distributed,
)

__all__ = [
    "Cache",
    "CacheStats",
    "CachedTable",
    "DistributedInput",
    "HashTableStorage",
    "PrefetchPipeline",
    "Storage",
    "StorageSpec",
    "distribute_for_prefetch",
    "make_backing_storage",
    "prefetch_distributed",
]
