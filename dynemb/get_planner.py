"""DynamicEmb's ``dynamicemb.get_planner``: a ready planner for a model whose tables are
data-parallel, dynamic, or ordinary row-wise.

A front module: it re-exports ``dynemb.planner.ready_planner`` and no module of dynemb
imports it.
"""

from dynemb.planner.ready_planner import get_planner

__all__ = ["get_planner"]
