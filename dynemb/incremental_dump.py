"""DynamicEmb's ``dynamicemb.incremental_dump``: the entries of a model's dynamic tables
touched since a score reference (``get_score``, ``set_score``, ``incremental_dump``).

A front module: it re-exports ``dynemb.checkpoint.incremental``, which says what a
score reference is per score strategy; no module of dynemb imports it.
"""

from dynemb.checkpoint.incremental import get_score, incremental_dump, set_score

__all__ = ["get_score", "incremental_dump", "set_score"]
