"""The JSON files of checkpoints and deltas (manifests, ``opt_args.json``), parsed with
a bound on their nesting: a file nested deeper than any of ours is refused as a
CheckpointError instead of exhausting Python's recursion (in the parser, or later in
the checksum and schema checks that walk the document)."""

import json
from pathlib import Path

from dynemb.dump_files.format import CheckpointError

MAX_DEPTH = 32  # levels of arrays / objects; dynemb writes at most 5


def parse_json(text: str, file: Path, what: str = "JSON") -> object:
    """The document ``text`` (the content of ``file``, a ``what``: named in errors).

    Raises:
        CheckpointError: naming ``file``: not JSON, or nested deeper than MAX_DEPTH.
    """
    try:
        document = json.loads(text)
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{file}: unreadable {what} ({e})") from e
    except RecursionError as e:
        raise CheckpointError(_too_deep(file)) from e
    if _depth(document) > MAX_DEPTH:
        raise CheckpointError(_too_deep(file))
    return document


def _too_deep(file: Path) -> str:
    return f"{file}: JSON nested deeper than {MAX_DEPTH} levels; the file is damaged or forged"


def _depth(document: object) -> int:
    """Levels of arrays and objects in ``document`` (iterative: no recursion)."""
    deepest, stack = 0, [(document, 1)]
    while stack:
        value, depth = stack.pop()
        children = value.values() if isinstance(value, dict) else value
        if isinstance(value, dict | list):
            deepest = max(deepest, depth)
            if deepest > MAX_DEPTH:
                return deepest
            stack.extend((child, depth + 1) for child in children)
    return deepest


__all__ = ["MAX_DEPTH", "parse_json"]
