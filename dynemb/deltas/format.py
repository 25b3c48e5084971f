"""On-disk format of a versioned delta: written atomically, read with every check.

    <directory>/delta-<version, 8 digits>/manifest.json
    <directory>/delta-<version, 8 digits>/<table>.<field>   raw little-endian arrays

    manifest.json = {
        "format": "dynemb-delta", "version": 1,
        "checksum": "sha256:<hex of the canonical JSON of every other field>",
        "delta_version": N (>= 1),  "base_dump_id": the dump id of the base checkpoint,
        "optim": bool,
        "tables": {<collection>.<table>: {dim, value_dtype, state_columns, score_strategy,
                   upserts, tombstones,
                   fields: {<field>: {file, bytes, crc32}}}}}

Fields: ``keys`` int64, ``values`` (dim columns, the table's value dtype) and
``scores`` int64 for each of ``upserts`` rows; ``state`` (state_columns, with
``optim``), ``timestamps`` int64 ((TIMESTAMP, LFU) tables); ``tombstones`` int64,
``tombstones`` rows: keys no longer stored.

A delta is written into a hidden temporary directory (files fsynced, then the
manifest, as a checkpoint's), which is renamed to ``delta-<N>`` (the commit point;
the rename fails when ``delta-<N>`` exists, so a version is never written twice) under
the directory's dump lock (dynemb/checkpoint/dump_lock.py). A reader therefore sees a
complete delta or none.
"""

import dataclasses
import os
import re
import shutil
import uuid
from pathlib import Path

import torch

from dynemb.checkpoint.dump_lock import dump_lock
from dynemb.dump_files.format import (
    VERIFY_BLOCK,
    CheckpointError,
    FieldWriter,
    check_size,
    crc32_of_range,
    dtype_name,
    dtype_of,
    fsync_dir,
    read_rows,
)
from dynemb.dump_files.json_files import parse_json
from dynemb.dump_files.manifest import INT64_MAX, MANIFEST, checksum, write_manifest

FORMAT = "dynemb-delta"
VERSION = 1
PREFIX = "delta-"
_NAME = re.compile(r"^[^/\\\0]+$")
_TOP = {"format", "version", "checksum", "delta_version", "base_dump_id", "optim", "tables"}
_TABLE = {
    "dim",
    "value_dtype",
    "state_columns",
    "score_strategy",
    "upserts",
    "tombstones",
    "fields",
}


@dataclasses.dataclass
class TableDelta:
    """One table's changes.

    Attributes:
        keys: (n,) int64 keys upserted.
        values: (n, dim) their embeddings (the table's value dtype).
        scores: (n,) int64 their scores (0 under NO_EVICTION).
        state: (n, state_columns) their optimizer state, or None (``optim=False``).
        timestamps: (n,) int64 last-access times ((TIMESTAMP, LFU)), or None.
        tombstones: (m,) int64 keys no longer stored (evicted, erased, expired).
        score_strategy: the table's score strategy, as the checkpoint manifest writes it.
    """

    keys: torch.Tensor
    values: torch.Tensor
    scores: torch.Tensor
    state: torch.Tensor | None
    timestamps: torch.Tensor | None
    tombstones: torch.Tensor
    score_strategy: str = ""

    @property
    def dim(self) -> int:
        return self.values.shape[1]


@dataclasses.dataclass
class Delta:
    """A read delta: ``version``, the base checkpoint's ``base_dump_id``, and
    ``tables``: ``{<collection>.<table>: TableDelta}``."""

    version: int
    base_dump_id: str
    tables: dict[str, TableDelta]
    path: Path


class DeltaVersionError(ValueError):
    """A delta that does not follow the state it is applied to (a gap, a duplicate, or
    another base checkpoint)."""


def delta_path(directory: str | Path, version: int) -> Path:
    """``<directory>/delta-<version, 8 digits>``."""
    return Path(directory) / f"{PREFIX}{version:08d}"


def write_delta(
    directory: Path, version: int, base_dump_id: str, optim: bool, tables: dict
) -> Path:
    """Writes delta ``version`` atomically (see the module docstring); returns its path.

    ``tables``: ``{name: (meta dict, TableDelta)}``.

    Raises:
        FileExistsError: ``delta-<version>`` exists already (nothing is written).
        OSError: a file could not be written, naming it (nothing is committed).
    """
    final = delta_path(directory, version)
    with dump_lock(directory):
        if final.exists():
            raise FileExistsError(
                f"DeltaPublisher: {final} exists already; versions are written once"
            )
        tmp = directory / f".{final.name}.tmp-{uuid.uuid4().hex[:12]}"
        tmp.mkdir()
        try:
            manifest = {
                "format": FORMAT,
                "version": VERSION,
                "delta_version": version,
                "base_dump_id": base_dump_id,
                "optim": optim,
                "tables": {n: _write_table(tmp, n, m, d) for n, (m, d) in sorted(tables.items())},
            }
            fsync_dir(tmp)
            write_manifest(tmp, manifest)
            os.rename(tmp, final)  # the commit point
            fsync_dir(directory)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return final


def _write_table(directory: Path, name: str, meta: dict, d: TableDelta) -> dict:
    fields = {"keys": d.keys, "values": d.values, "scores": d.scores, "tombstones": d.tombstones}
    if d.state is not None:
        fields["state"] = d.state
    if d.timestamps is not None:
        fields["timestamps"] = d.timestamps
    written = {}
    for field, tensor in fields.items():
        writer = FieldWriter(directory / f"{name}.{field}")
        try:
            writer.write(tensor.cpu())
        except BaseException:
            writer.abort()
            raise
        written[field] = writer.close()
    return {
        **meta,
        "upserts": int(d.keys.numel()),
        "tombstones": int(d.tombstones.numel()),
        "fields": written,
    }


def read_delta(path: str | Path) -> Delta:
    """Reads and verifies a delta directory: its manifest (checksum, schema) and every
    file (size and CRC-32), before returning anything.

    Raises:
        CheckpointError: naming the file that is missing, damaged or inconsistent, or
            the delta and table whose content contradicts itself (a key upserted or
            tombstoned twice, or both; a negative score or timestamp).
    """
    path = Path(path)
    manifest = _read_manifest(path)
    block = torch.empty(VERIFY_BLOCK, dtype=torch.uint8)
    tables = {}
    for name, meta in manifest["tables"].items():
        dtype = dtype_of(meta["value_dtype"])
        widths = _widths(meta, dtype)
        rows = {f: meta["tombstones"] if f == "tombstones" else meta["upserts"] for f in widths}
        for field, entry in meta["fields"].items():
            width, elem = widths[field]
            check_size(path, entry, rows[field] * max(width, 1) * elem.itemsize)
            crc = crc32_of_range(path / entry["file"], 0, entry["bytes"], block)
            if crc != entry["crc32"]:
                raise CheckpointError(
                    f"{path / entry['file']}: CRC-32 {crc:#010x}, the manifest records "
                    f"{entry['crc32']:#010x}: the file is damaged"
                )
        loaded = {
            f: read_rows(path, e, 0, rows[f], widths[f][1], widths[f][0])
            for f, e in meta["fields"].items()
        }
        _check_content(path, name, loaded)
        tables[name] = TableDelta(
            keys=loaded["keys"],
            values=loaded["values"],
            scores=loaded["scores"],
            state=loaded.get("state"),
            timestamps=loaded.get("timestamps"),
            tombstones=loaded["tombstones"],
            score_strategy=meta["score_strategy"],
        )
    return Delta(manifest["delta_version"], manifest["base_dump_id"], tables, path)


def _check_content(path: Path, name: str, loaded: dict) -> None:
    """What the checksums cannot vouch for (whoever wrote the files may have recomputed
    them): a key is upserted or tombstoned at most once, never both, and scores and
    timestamps are >= 0.

    Raises:
        CheckpointError: naming the delta, the table and the offending key.
    """
    keys, tombstones = loaded["keys"], loaded["tombstones"]
    for what, k in (("upserted", keys), ("tombstoned", tombstones)):
        ordered = torch.sort(k).values
        twice = ordered[1:][ordered[1:] == ordered[:-1]]
        if twice.numel():
            raise CheckpointError(
                f"{path}: table {name!r} has key {int(twice[0])} {what} twice; the delta is "
                "damaged or forged"
            )
    both = keys[torch.isin(keys, tombstones)]
    if both.numel():
        raise CheckpointError(
            f"{path}: table {name!r} both upserts and tombstones key {int(both[0])}; the "
            "delta is damaged or forged"
        )
    for field in ("scores", "timestamps"):
        values = loaded.get(field)
        if values is not None and values.numel() and int(values.min()) < 0:
            at = int(torch.argmin(values))
            raise CheckpointError(
                f"{path}: table {name!r} has {field[:-1]} {int(values[at])} < 0 for key "
                f"{int(keys[at])}; the delta is damaged or forged"
            )


def _widths(meta: dict, dtype: torch.dtype) -> dict:
    """field -> (columns (0: a 1-D array), element dtype)."""
    return {
        "keys": (0, torch.int64),
        "values": (meta["dim"], dtype),
        "scores": (0, torch.int64),
        "tombstones": (0, torch.int64),
        "state": (meta["state_columns"], dtype),
        "timestamps": (0, torch.int64),
    }


def _read_manifest(path: Path) -> dict:
    file = path / MANIFEST
    if not file.is_file():
        raise CheckpointError(f"{file}: no manifest; {path} is not a delta")
    try:
        text = file.read_bytes().decode("utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{file}: unreadable manifest ({e})") from e
    manifest = parse_json(text, file, "manifest")
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise CheckpointError(f"{file}: not a dynemb delta manifest")
    if manifest.get("version") != VERSION:
        raise CheckpointError(
            f"{file}: delta format version {manifest.get('version')!r}, this dynemb reads {VERSION}"
        )
    if manifest.get("checksum") != checksum(manifest):
        raise CheckpointError(
            f"{file}: checksum {manifest.get('checksum')!r} does not match its content: "
            "the manifest is damaged or was edited"
        )
    _check_schema(file, manifest)
    return manifest


def _check_schema(file: Path, m: dict) -> None:
    def fail(where, what, value):
        raise CheckpointError(f"{file}: {where} must be {what}, got {value!r}")

    def int_in(where, value, low):
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= INT64_MAX:
            fail(where, f"an integer in [{low}, {INT64_MAX}]", value)

    if set(m) != _TOP:
        fail("the manifest", f"an object with keys {sorted(_TOP)}", sorted(m))
    int_in("delta_version", m["delta_version"], 1)
    if not isinstance(m["base_dump_id"], str) or not m["base_dump_id"]:
        fail("base_dump_id", "a non-empty string", m["base_dump_id"])
    if not isinstance(m["optim"], bool) or not isinstance(m["tables"], dict):
        fail("optim / tables", "a bool / an object", (m["optim"], type(m["tables"]).__name__))
    for name, meta in m["tables"].items():
        where = f"tables[{name!r}]"
        if not _NAME.match(name) or not isinstance(meta, dict) or not _TABLE <= set(meta):
            fail(where, f"an object with keys {sorted(_TABLE)}", meta)
        for field, low in (("dim", 1), ("state_columns", 0), ("upserts", 0), ("tombstones", 0)):
            int_in(f"{where}.{field}", meta[field], low)
        try:
            dtype_of(meta["value_dtype"])
        except CheckpointError:
            fail(f"{where}.value_dtype", "float32, float16 or bfloat16", meta["value_dtype"])
        fields = meta["fields"]
        required = {"keys", "values", "scores", "tombstones"} | ({"state"} if m["optim"] else set())
        allowed = required | {"state", "timestamps"}
        if not isinstance(fields, dict) or not required <= set(fields) <= allowed:
            fail(f"{where}.fields", f"fields {sorted(required)} (and timestamps)", fields)
        for field, entry in fields.items():
            if not isinstance(entry, dict) or set(entry) != {"file", "bytes", "crc32"}:
                fail(f"{where}.fields.{field}", "{file, bytes, crc32}", entry)
            if (
                not isinstance(entry["file"], str)
                or not _NAME.match(entry["file"])
                or entry["file"] in (".", "..")
            ):
                fail(f"{where}.fields.{field}.file", "a plain file name", entry["file"])
            int_in(f"{where}.fields.{field}.bytes", entry["bytes"], 0)
            int_in(f"{where}.fields.{field}.crc32", entry["crc32"], 0)


def table_delta_meta(dim: int, dtype: torch.dtype, state_columns: int, strategy: str) -> dict:
    """The per-table fields of the manifest besides the counts and files."""
    return {
        "dim": dim,
        "value_dtype": dtype_name(dtype),
        "state_columns": state_columns,
        "score_strategy": strategy,
    }


__all__ = [
    "Delta",
    "DeltaVersionError",
    "TableDelta",
    "delta_path",
    "read_delta",
    "table_delta_meta",
    "write_delta",
]
