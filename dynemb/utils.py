"""DynamicEmb's ``dynamicemb.utils``: the TorchRec collection types whose sharded forms
hold dynamic tables, element sizes, and the dtype and eviction-name converters.

A front module: it re-exports ``dynemb.config.dtypes`` and no module of dynemb imports it.
"""

from dynemb.config.dtypes import (
    DTYPE_NUM_BYTES,
    TORCHREC_TYPES,
    data_type_to_dtype,
    data_type_to_dyn_emb,
    dyn_emb_to_torch,
    string_to_evict_strategy,
    torch_to_dyn_emb,
)

__all__ = [
    "DTYPE_NUM_BYTES",
    "TORCHREC_TYPES",
    "data_type_to_dtype",
    "data_type_to_dyn_emb",
    "dyn_emb_to_torch",
    "string_to_evict_strategy",
    "torch_to_dyn_emb",
]
