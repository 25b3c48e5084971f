"""NVIDIA DynamicEmb's checkpoint layout: file names, key and score conversions, validation.

    <path>/<collection path>/                       "model" or "model.<module path>"
        <T>_opt_args.json                           written by rank 0
        <T>_emb_keys.rank_<r>.world_size_<W>        int64 (N,)
        <T>_emb_values.rank_<r>.world_size_<W>      float32 (N, dim)
        <T>_emb_scores.rank_<r>.world_size_<W>      int64 (N,), or (N, 2) for (TIMESTAMP, LFU)
        <T>_emb_opt_values.rank_<r>.world_size_<W>  float32 (N, state columns), with optim
        <T>_counter_keys.rank_<r>.world_size_<W>    int64 (M,), with counter
        <T>_counter_frequencies.rank_<r>.world_size_<W>  int64 (M,), with counter

Files are headerless and little-endian; the files of one rank share their row order.
A TIMESTAMP score is saved as an age (dump time - last access, nanoseconds); the
others as they are. Under ``dist_type="continuous"`` a table holds the local id its
owner received (``key mod block`` or ``key div world``), so do the files: the
conversions below map them from and to raw keys. Nothing here reads a table; the
validation returns the errors of a table's file set without changing anything.
"""

import dataclasses
import re
from pathlib import Path

import torch

from dynemb.config.optimizer import DynamicEmbOptimType, EmbOptimType, OptimType
from dynemb.config.types import DynamicEmbScoreStrategy
from dynemb.dump_files.format import CheckpointError
from dynemb.dump_files.json_files import parse_json

OPT_ARGS = "{table}_opt_args.json"
FIELDS = {  # field -> (file stem, dtype)
    "keys": ("emb_keys", torch.int64),
    "values": ("emb_values", torch.float32),
    "scores": ("emb_scores", torch.int64),
    "state": ("emb_opt_values", torch.float32),
    "counter_keys": ("counter_keys", torch.int64),
    "counter_counts": ("counter_frequencies", torch.int64),
}
_KEYS_FILE = re.compile(r"^(?P<table>.+)_emb_keys\.rank_(?P<rank>\d+)\.world_size_(?P<world>\d+)$")
_OPT_TYPE = {
    EmbOptimType.SGD: "sgd",
    EmbOptimType.EXACT_SGD: "sgd",
    EmbOptimType.ADAM: "adam",
    EmbOptimType.EXACT_ADAGRAD: "exact_adagrad",
    EmbOptimType.EXACT_ROWWISE_ADAGRAD: "exact_row_wise_adagrad",
    DynamicEmbOptimType.FTRL: "ftrl",
}
_MASK64 = (1 << 64) - 1


def file_name(table: str, field: str, rank: int, world_size: int) -> str:
    """``<table>_<stem>.rank_<rank>.world_size_<world_size>`` of a field of FIELDS."""
    return f"{table}_{FIELDS[field][0]}.rank_{rank}.world_size_{world_size}"


def opt_type_name(optimizer: OptimType) -> str:
    """DynamicEmb's ``opt_type`` string of an optimizer (EXACT_SGD is saved as "sgd")."""
    return _OPT_TYPE[optimizer]


def is_dynamicemb_layout(path: Path) -> bool:
    """Whether ``path`` holds a collection directory with DynamicEmb key files."""
    return path.is_dir() and any(saved_tables(path))


def saved_tables(path: Path) -> set[tuple[str, str]]:
    """``(collection path, table)`` of every table with key files under ``path``."""
    found = set()
    for directory in path.iterdir() if path.is_dir() else ():
        if directory.is_dir():
            for file in directory.iterdir():
                if m := _KEYS_FILE.match(file.name):
                    found.add((directory.name, m["table"]))
    return found


def score_columns(score_strategy) -> list[str]:
    """What each column of the scores file holds: ``"age"`` (TIMESTAMP, saved as dump
    time - last access) or ``"raw"``; the compound's two columns in the user's order."""
    if isinstance(score_strategy, tuple):
        return ["age" if s == DynamicEmbScoreStrategy.TIMESTAMP else "raw" for s in score_strategy]
    return ["age" if score_strategy == DynamicEmbScoreStrategy.TIMESTAMP else "raw"]


# ------------------------------------------------------------------ continuous ids


def _const(value: int) -> int:
    value &= _MASK64
    return value - (1 << 64) if value >= 1 << 63 else value


def _unsigned_divmod(keys: torch.Tensor, d: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(k div d, k mod d)`` of int64 keys read as uint64 (d >= 2)."""
    q0, r0 = divmod(1 << 64, d)  # a negative k is k + 2**64 as uint64
    neg = keys < 0
    shifted = torch.where(neg, keys + r0, keys)  # no overflow: keys < 0 there
    q = torch.div(shifted, d, rounding_mode="floor")
    r = torch.remainder(shifted, d)
    return torch.where(neg, q + _const(q0), q), r


def _below(keys: torch.Tensor, bound: int) -> torch.Tensor:
    """``k < bound`` with k read as uint64 (bound < 2**63)."""
    return (keys >= 0) & (keys < bound)


def continuous_local_ids(keys: torch.Tensor, world_size: int, num_embeddings: int):
    """What DynamicEmb's continuous routing sends to the owner: ``(rank, local id)``.

    Keys below ``block * world_size`` (block = ceil(num_embeddings / world_size))
    go to ``k div block`` as ``k mod block``; the others to ``k mod world_size`` as
    ``k div world_size`` (k as uint64).
    """
    if world_size == 1:
        return torch.zeros_like(keys), keys.clone()
    block = max(1, -(-num_embeddings // world_size))
    inside = _below(keys, block * world_size)
    q, r = _unsigned_divmod(keys, world_size)
    return (
        torch.where(inside, torch.div(keys, block, rounding_mode="floor"), r),
        torch.where(inside, torch.remainder(keys, block), q),
    )


def continuous_keys(local: torch.Tensor, rank: int, world_size: int, num_embeddings: int):
    """The raw keys of the local ids ``local`` held by ``rank`` of ``world_size``: the
    inverse of continuous_local_ids (ids below the block came from the block)."""
    if world_size == 1:
        return local.clone()
    block = max(1, -(-num_embeddings // world_size))
    return torch.where(_below(local, block), local + rank * block, local * world_size + rank)


# ------------------------------------------------------------------ validation


@dataclasses.dataclass
class SavedShard:
    """The files of one saved rank of a table: ``rows`` entries, ``counter_rows`` counts."""

    rank: int
    rows: int
    counter_rows: int
    files: dict  # field -> Path


@dataclasses.dataclass
class SavedTable:
    """A table's file set, validated: its saved world size and shards."""

    directory: Path
    table: str
    world_size: int
    shards: list[SavedShard]


def file_problem(file: Path) -> str | None:
    """Why ``file`` cannot be read as a file of its collection directory, or None: missing,
    a dangling or looping symbolic link, not a regular file, or a link out of the directory
    (a hostile checkpoint must not make dynemb read any file it names)."""
    try:
        target = file.resolve(strict=True)
    except FileNotFoundError:
        return f"{file}: a dangling symbolic link" if file.is_symlink() else f"{file}: missing"
    except (OSError, RuntimeError) as e:  # ELOOP (RuntimeError: pathlib's own loop check)
        return f"{file}: cannot be resolved ({e})"
    if not target.is_file():
        return f"{file}: not a regular file"
    if not target.is_relative_to(file.parent.resolve()):
        return f"{file}: leads to {target}, outside the checkpoint directory; refused"
    return None


def read_opt_args(directory: Path, table: str) -> tuple[dict | None, list[str]]:
    """The table's ``opt_args.json`` (None if there is none), and the error if unreadable."""
    file = directory / OPT_ARGS.format(table=table)
    if not file.is_symlink() and not file.exists():
        return None, []
    if problem := file_problem(file):
        return None, [problem]
    try:
        args = parse_json(file.read_text(), file)
    except CheckpointError as e:
        return None, [str(e)]
    except (OSError, ValueError) as e:  # ValueError: text that is not UTF-8
        return None, [f"{file}: unreadable JSON ({e})"]
    if not isinstance(args, dict):
        return None, [f"{file}: expected a JSON object, got {type(args).__name__}"]
    return args, []


def _size_error(
    file: Path, nbytes: int, rows: int, what: str, source: str = "the keys file"
) -> str | None:
    if problem := file_problem(file):
        return problem
    size = file.stat().st_size
    if size != nbytes:
        return (
            f"{file}: {size} bytes, expected {nbytes} ({rows} rows of {what}, as {source} "
            "implies): truncated, extended, or saved with another width"
        )
    return None


def key_rows(file: Path) -> tuple[int, str | None]:
    """``(rows, None)`` of a file of int64 keys, or ``(0, error)`` if its size is not a
    whole number of keys (a key file is what the sizes of its rank's other files follow)."""
    if problem := file_problem(file):
        return 0, problem
    size = file.stat().st_size
    if size % 8:
        whole = size - size % 8
        return 0, (
            f"{file}: {size} bytes, expected a multiple of 8 (whole int64 keys, e.g. {whole} "
            f"or {whole + 8}): truncated or extended"
        )
    return size // 8, None


def validate_table(
    directory: Path, table: str, dim: int, score_width: int, state_columns: int, counter: bool
) -> tuple[SavedTable | None, list[str]]:
    """Checks a table's files: one world size, every rank present, sizes that agree.

    Args:
        directory: the collection directory.
        table: the table name.
        dim: embedding columns the values file must hold.
        score_width: columns of the scores file (1, or 2 for (TIMESTAMP, LFU)).
        state_columns: columns of the optimizer-state file (0: not read).
        counter: also check the admission counter files (when a rank has them).

    Returns:
        ``(saved table, [])``, or ``(None, errors)`` naming each bad file.
    """
    errors: list[str] = []
    found = {}
    for file in sorted(directory.iterdir()) if directory.is_dir() else ():
        m = _KEYS_FILE.match(file.name)
        if m and m["table"] == table:
            found[(int(m["rank"]), int(m["world"]))] = file
    if not found:
        return None, [f"{directory}: no saved table {table!r} (no {table}_emb_keys.* file)"]
    worlds = sorted({w for _, w in found})
    if len(worlds) > 1:
        return None, [f"{directory}: table {table!r} has key files of world sizes {worlds}"]
    world = worlds[0]
    shards = []
    for rank in range(world):
        keys_file = directory / file_name(table, "keys", rank, world)
        if (rank, world) not in found:
            errors.append(f"{keys_file}: missing (rank {rank} of world size {world})")
            continue
        rows, error = key_rows(keys_file)
        if error:
            errors.append(error)
            continue
        files = {f: directory / file_name(table, f, rank, world) for f in FIELDS}
        checks = [
            ("values", dim * 4, f"{dim} float32"),
            ("scores", score_width * 8, "int64 scores"),
        ]
        if state_columns:
            checks.append(("state", state_columns * 4, f"{state_columns} float32 states"))
        for field, row_bytes, what in checks:
            if error := _size_error(files[field], rows * row_bytes, rows, what):
                errors.append(error)
        counter_rows = 0
        if counter and files["counter_keys"].is_file():
            counter_rows, error = key_rows(files["counter_keys"])
            error = error or _size_error(
                files["counter_counts"], counter_rows * 8, counter_rows, "int64 counts",
                files["counter_keys"].name,
            )  # fmt: skip
            if error:
                errors.append(error)
        shards.append(SavedShard(rank, rows, counter_rows, files))
    if errors:
        return None, errors
    return SavedTable(directory, table, world, shards), []


def read_field(shard: SavedShard, field: str, begin: int, end: int, width: int) -> torch.Tensor:
    """Rows [begin, end) of one field file: (end - begin, width), or (end - begin,) if width 0."""
    dtype = FIELDS[field][1]
    out = torch.empty((end - begin, width) if width else (end - begin,), dtype=dtype)
    raw = memoryview(out.view(torch.uint8).reshape(-1).numpy())
    row_bytes = out.element_size() * max(1, width)
    got = 0
    with open(shard.files[field], "rb", buffering=0) as f:
        f.seek(begin * row_bytes)
        while got < len(raw) and (n := f.readinto(raw[got:])):
            got += n
    if got != len(raw):
        raise CheckpointError(f"{shard.files[field]}: shorter than when it was checked")
    return out
