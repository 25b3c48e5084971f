"""DynamicEmb's ``dynamicemb.batched_dynamicemb_tables``: ``BatchedDynamicEmbeddingTablesV2``.

A front module: it re-exports ``dynemb.tbe.v2_tables`` and no module of dynemb imports it.
"""

from dynemb.tbe.v2_tables import BatchedDynamicEmbeddingTablesV2

__all__ = ["BatchedDynamicEmbeddingTablesV2"]
