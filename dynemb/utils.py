"""DynamicEmb's ``dynamicemb.utils`` names: the TorchRec collection types whose sharded
forms hold dynamic tables, element sizes, and a dtype converter."""

import torch
from torchrec.modules.embedding_modules import EmbeddingBagCollection, EmbeddingCollection

from dynemb.converters import torch_to_dyn_emb

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

__all__ = ["DTYPE_NUM_BYTES", "TORCHREC_TYPES", "torch_to_dyn_emb"]
