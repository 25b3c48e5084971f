"""DynamicEmb's ``dynamicemb.utils`` names (the TorchRec collection types whose sharded
forms hold dynamic tables, element sizes) and its dtype and eviction-name converters
(``dynamicemb.torch_to_dyn_emb`` ..., re-exported by ``dynemb`` and
``dynemb.dynamicemb_config`` where DynamicEmb has them). Each converter raises
``ValueError`` naming the input it does not know."""

import torch
from torchrec.modules.embedding_configs import DataType
from torchrec.modules.embedding_modules import EmbeddingBagCollection, EmbeddingCollection

from dynemb.config.types import DynamicEmbDataType, EvictStrategy

TORCHREC_TYPES = {EmbeddingBagCollection, EmbeddingCollection}
"""The TorchRec modules a dynemb sharder shards (pooled and sequence collections)."""

DTYPE_NUM_BYTES = {
    dtype: dtype.itemsize
    for dtype in (
        torch.float32,
        torch.float16,
        torch.bfloat16,
        torch.int64,
        torch.uint64,
        torch.int32,
        torch.uint32,
    )
}
"""Bytes of one element of each dtype a table or checkpoint uses (``torch.float16`` -> 2)."""

__all__ = [
    "DTYPE_NUM_BYTES",
    "TORCHREC_TYPES",
    "data_type_to_dtype",
    "data_type_to_dyn_emb",
    "dyn_emb_to_torch",
    "string_to_evict_strategy",
    "torch_to_dyn_emb",
]

_TORCH_TO_DYN_EMB = {
    torch.float32: DynamicEmbDataType.Float32,
    torch.bfloat16: DynamicEmbDataType.BFloat16,
    torch.float16: DynamicEmbDataType.Float16,
    torch.int64: DynamicEmbDataType.Int64,
    torch.uint64: DynamicEmbDataType.UInt64,
    torch.int32: DynamicEmbDataType.Int32,
    torch.uint32: DynamicEmbDataType.UInt32,
}
_DYN_EMB_TO_TORCH = {v: k for k, v in _TORCH_TO_DYN_EMB.items()}
_DATA_TYPE_TO_DTYPE = {
    DataType.FP32: torch.float32,
    DataType.FP16: torch.float16,
    DataType.BF16: torch.bfloat16,
    DataType.INT64: torch.int64,
    DataType.INT32: torch.int32,
}
_EVICT_STRATEGIES = {
    "lru": EvictStrategy.KLru,
    "lfu": EvictStrategy.KLfu,
    "epoch_lru": EvictStrategy.KEpochLru,
    "epoch_lfu": EvictStrategy.KEpochLfu,
    "customized": EvictStrategy.KCustomized,
}


def torch_to_dyn_emb(torch_dtype: torch.dtype) -> DynamicEmbDataType:
    """``torch.float32`` -> ``DynamicEmbDataType.Float32`` (also bfloat16, float16,
    int64, uint64, int32, uint32).

    Example::

        torch_to_dyn_emb(torch.float16)  # DynamicEmbDataType.Float16
    """
    if torch_dtype not in _TORCH_TO_DYN_EMB:
        raise ValueError(
            f"torch_to_dyn_emb: unsupported dtype {torch_dtype!r}; expected one of "
            f"{list(_TORCH_TO_DYN_EMB)}"
        )
    return _TORCH_TO_DYN_EMB[torch_dtype]


def dyn_emb_to_torch(data_type: DynamicEmbDataType) -> torch.dtype:
    """The inverse of ``torch_to_dyn_emb``."""
    if data_type not in _DYN_EMB_TO_TORCH:
        raise ValueError(
            f"dyn_emb_to_torch: unsupported data type {data_type!r}; expected a DynamicEmbDataType"
        )
    return _DYN_EMB_TO_TORCH[data_type]


def data_type_to_dtype(data_type: DataType) -> torch.dtype:
    """TorchRec's ``DataType`` (FP32, FP16, BF16, INT64, INT32) -> ``torch.dtype``."""
    if data_type not in _DATA_TYPE_TO_DTYPE:
        raise ValueError(
            f"data_type_to_dtype: unsupported data type {data_type!r}; expected one of "
            f"{[d.name for d in _DATA_TYPE_TO_DTYPE]}"
        )
    return _DATA_TYPE_TO_DTYPE[data_type]


def data_type_to_dyn_emb(data_type: DataType) -> DynamicEmbDataType:
    """TorchRec's ``DataType`` -> ``DynamicEmbDataType`` (through its torch dtype)."""
    return torch_to_dyn_emb(data_type_to_dtype(data_type))


def string_to_evict_strategy(strategy_str: str) -> EvictStrategy:
    """ "lru", "lfu", "epoch_lru", "epoch_lfu", "customized" -> ``EvictStrategy.KLru`` ...

    Example::

        string_to_evict_strategy("lfu")  # EvictStrategy.KLfu
    """
    if strategy_str not in _EVICT_STRATEGIES:
        raise ValueError(
            f"string_to_evict_strategy: unknown strategy {strategy_str!r}; expected one of "
            f"{list(_EVICT_STRATEGIES)}"
        )
    return _EVICT_STRATEGIES[strategy_str]
