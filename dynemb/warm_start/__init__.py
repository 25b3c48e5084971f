"""Warm start: a dynamic table reads a key's first row from a source (a static table,
a checkpoint, a Storage) instead of its initializer. See DynamicEmb_APIs.md, "Warm start"."""

from dynemb.warm_start.sources import WarmRows, WarmStart
from dynemb.warm_start.table_fill import TableFill

__all__ = ["TableFill", "WarmRows", "WarmStart"]
