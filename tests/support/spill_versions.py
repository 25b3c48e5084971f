"""Spill directories as an earlier format left them: their committed metadata's version
rewritten (dynemb/table/spill_files.py)."""

import json
import os

from dynemb.table import spill_files


def rewrite_version(directory: str, version: int) -> int:
    """Sets the version in ``directory``'s committed metadata to ``version``; returns the
    version it had."""
    path = os.path.join(directory, spill_files.META_FILE)
    with open(path) as f:
        meta = json.load(f)
    had, meta["version"] = meta["version"], version
    with open(path, "w") as f:
        json.dump(meta, f)
    return had
