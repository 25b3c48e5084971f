"""The manifest of a dynemb checkpoint: its atomic commit, its checksum and its schema.

    <path>/manifest.json = {
        "format": "dynemb-checkpoint", "version": 2,
        "checksum": "sha256:<hex of the canonical JSON of every other field>",
        "dump_id": "dump-<time>-<hex>",          the dump directory, a plain name
        "optim": bool,
        "tables": {<name>: {dim, value_dtype, optimizer, state_columns, score_strategy,
                            bucket_capacity, capacity_per_rank, dist_type, num_embeddings,
                            world_size, optimizer_step, table_step,
                            [column_slices: [[offset, width], ...]],  (version 3)
                            files: [one entry per saved rank, in rank order:
                                    {rank, rows, [counter_rows],
                                     fields: {<field>: {file, bytes, crc32}}}]}}}

A table's ``world_size`` counts the ranks that held it: all of them row-wise; one for
a table-wise table, whose files are that rank's (entry ``rank`` 0); one per column
slice for a column-wise table (``column_slices``, in column order: the slices side by
side are the ``dim`` columns, and every slice's files hold the same keys in the same
order; see columns.py). A manifest with column slices has version 3, so that a dynemb
that reads versions 1-2 only refuses it rather than misread it.

A manifest is read in one pass that checks everything a load will trust: UTF-8, JSON,
the checksum (which catches a damaged manifest; a hostile one can recompute it, so
the schema is checked too), every field's type and range (steps fit in int64 and are
non-negative, a table has one file entry per saved rank) and every file name (a plain
name inside the dump directory: no absolute path, no ``..``, no directory part). The
load changes no table before ``read_manifest`` returned. Version 1 manifests (without
a checksum) are still read, with the same schema.
"""

import hashlib
import json
import os
import re
from pathlib import Path

from dynemb.config.optimizer import DynamicEmbOptimType, EmbOptimType
from dynemb.dump_files.format import CheckpointError, dtype_of, fsync_dir
from dynemb.dump_files.json_files import parse_json

FORMAT = "dynemb-checkpoint"
VERSION = 2
SLICES_VERSION = 3  # a manifest with column slices
READABLE_VERSIONS = (1, 2, 3)
MANIFEST = "manifest.json"
INT64_MAX = (1 << 63) - 1

DUMP_ID = re.compile(r"^dump-[0-9A-Za-z-]{1,100}$")
_FIELDS = ("keys", "values", "scores", "state", "timestamps", "counter_keys", "counter_counts")
_DIST_TYPES = ("roundrobin", "hash_roundrobin", "continuous")
_TOP = {"format", "version", "checksum", "dump_id", "optim", "tables"}
_TABLE_INTS = {  # field -> smallest value allowed
    "dim": 1,
    "state_columns": 0,
    "bucket_capacity": 1,
    "capacity_per_rank": 0,
    "num_embeddings": 0,
    "world_size": 1,
    "optimizer_step": 0,
    "table_step": 0,
}
_TABLE_STRS = ("value_dtype", "optimizer", "score_strategy", "dist_type")
_TABLE_KEYS = {*_TABLE_INTS, *_TABLE_STRS, "files"}

# checkpoints name an optimizer by its member name (EmbOptimType's, and FTRL)
_OPTIMIZER_NAMES = [*EmbOptimType.__members__, *DynamicEmbOptimType.__members__]


def checksum(manifest: dict) -> str:
    """``"sha256:<hex>"`` of the canonical JSON of ``manifest`` without its checksum."""
    body = {k: v for k, v in manifest.items() if k != "checksum"}
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()


def write_manifest(path: Path, manifest: dict) -> None:
    """Writes ``path/manifest.json`` with its checksum, atomically (temporary file,
    fsync, rename, fsync of the directory): the commit point of a dump.

    Raises:
        OSError: naming the file that could not be written (the temporary file is
            removed; the previous manifest stays as it was).
    """
    manifest = {**manifest, "checksum": checksum(manifest)}
    tmp = path / (MANIFEST + ".tmp")
    try:
        with open(tmp, "w") as f:
            json.dump(manifest, f, indent=1, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path / MANIFEST)
        fsync_dir(path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise OSError(e.errno, f"DynamicEmbDump: writing {tmp} failed: {e.strerror}") from e


def read_manifest(path: Path) -> dict:
    """Reads and validates ``path/manifest.json`` (see the module docstring).

    Raises:
        CheckpointError: naming the manifest and what is wrong in it.
    """
    file = path / MANIFEST
    if not file.is_file():
        raise CheckpointError(
            f"{file}: no manifest; {path} is not a checkpoint, or its first dump never completed"
        )
    try:
        text = file.read_bytes().decode("utf-8")
    except UnicodeDecodeError as e:
        raise CheckpointError(f"{file}: not UTF-8 text ({e}); the manifest is damaged") from e
    except OSError as e:
        raise CheckpointError(f"{file}: unreadable manifest ({e})") from e
    manifest = parse_json(text, file, "manifest")
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise CheckpointError(f"{file}: not a dynemb checkpoint manifest")
    version = manifest.get("version")
    if version not in READABLE_VERSIONS or isinstance(version, bool):
        raise CheckpointError(
            f"{file}: format version {version!r}, this dynemb reads versions {READABLE_VERSIONS}"
        )
    if version >= 2:
        want = checksum(manifest)
        if manifest.get("checksum") != want:
            raise CheckpointError(
                f"{file}: checksum {manifest.get('checksum')!r}, the content hashes to "
                f"{want!r}: the manifest is damaged or was edited"
            )
    _Schema(file).check(manifest)
    return manifest


class _Schema:
    """Checks a manifest's structure; every error names the file and the field."""

    def __init__(self, file: Path) -> None:
        self.file = file

    def fail(self, where: str, what: str, value) -> None:
        raise CheckpointError(f"{self.file}: {where} must be {what}, got {value!r}")

    def int_in(self, where: str, value, low: int, high: int = INT64_MAX) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            self.fail(where, f"an integer in [{low}, {high}]", value)
        return value

    def keys(self, where: str, obj, required: set, optional: set = frozenset()) -> None:
        if not isinstance(obj, dict):
            self.fail(where, "a JSON object", obj)
        missing = sorted(required - obj.keys())
        unknown = sorted(obj.keys() - required - optional)
        if missing or unknown:
            self.fail(where, f"an object with keys {sorted(required)}", sorted(obj))

    def check(self, m: dict) -> None:
        self.keys("the manifest", m, _TOP - {"checksum"}, {"checksum"})
        if not isinstance(m["dump_id"], str) or not DUMP_ID.match(m["dump_id"]):
            self.fail("dump_id", "a dump directory name dump-<letters, digits, ->", m["dump_id"])
        if not isinstance(m["optim"], bool):
            self.fail("optim", "true or false", m["optim"])
        if not isinstance(m["tables"], dict):
            self.fail("tables", "a JSON object", m["tables"])
        for name, meta in m["tables"].items():
            self.table(name, meta, m["optim"], m["version"] >= SLICES_VERSION)

    def table(self, name: str, meta, optim: bool, slices_allowed: bool) -> None:
        where = f"tables[{name!r}]"
        if not name or "/" in name or "\0" in name:
            self.fail("a table name", "a non-empty name without '/'", name)
        self.keys(where, meta, _TABLE_KEYS, {"column_slices"} if slices_allowed else set())
        for field, low in _TABLE_INTS.items():
            self.int_in(f"{where}.{field}", meta[field], low)
        for field in _TABLE_STRS:
            if not isinstance(meta[field], str):
                self.fail(f"{where}.{field}", "a string", meta[field])
        try:
            dtype_of(meta["value_dtype"])
        except CheckpointError:
            self.fail(f"{where}.value_dtype", "float32, float16 or bfloat16", meta["value_dtype"])
        if meta["optimizer"] not in _OPTIMIZER_NAMES:
            self.fail(f"{where}.optimizer", f"one of {_OPTIMIZER_NAMES}", meta["optimizer"])
        if meta["dist_type"] not in _DIST_TYPES:
            self.fail(f"{where}.dist_type", f"one of {_DIST_TYPES}", meta["dist_type"])
        files = meta["files"]
        if not isinstance(files, list) or len(files) != meta["world_size"]:
            self.fail(
                f"{where}.files",
                f"a list of one entry per saved rank ({meta['world_size']})",
                files if not isinstance(files, list) else f"{len(files)} entries",
            )
        required = {"keys", "values", "scores"} | ({"state"} if optim else set())
        for rank, entry in enumerate(files):
            self.entry(f"{where}.files[{rank}]", entry, rank, required)
        if "column_slices" in meta:
            self.column_slices(where, meta)

    def column_slices(self, where: str, meta: dict) -> None:
        """Slices side by side from column 0 to ``dim``, one per file entry, whose
        files hold the same keys (same rows, same keys file size and CRC-32)."""
        slices = meta["column_slices"]
        if not isinstance(slices, list) or len(slices) != meta["world_size"] or len(slices) < 2:
            self.fail(
                f"{where}.column_slices", f"a list of {meta['world_size']} (>= 2) slices", slices
            )
        column = 0
        for k, piece in enumerate(slices):
            if not isinstance(piece, list) or len(piece) != 2:
                self.fail(f"{where}.column_slices[{k}]", "[offset, width]", piece)
            self.int_in(f"{where}.column_slices[{k}][0]", piece[0], column, column)
            column += self.int_in(
                f"{where}.column_slices[{k}][1]", piece[1], 1, meta["dim"] - column
            )
        self.int_in(
            f"{where}.column_slices (the columns covered)", column, meta["dim"], meta["dim"]
        )
        first = meta["files"][0]
        for k, entry in enumerate(meta["files"][1:], 1):
            same = entry["rows"] == first["rows"] and all(
                entry["fields"]["keys"][f] == first["fields"]["keys"][f] for f in ("bytes", "crc32")
            )
            if not same:
                self.fail(f"{where}.files[{k}]", "a slice of the same keys as slice 0", entry)

    def entry(self, where: str, entry, rank: int, required: set) -> None:
        self.keys(where, entry, {"rank", "rows", "fields"}, {"counter_rows"})
        self.int_in(f"{where}.rank", entry["rank"], rank, rank)
        self.int_in(f"{where}.rows", entry["rows"], 0)
        fields = entry["fields"]
        if not isinstance(fields, dict) or not required <= fields.keys():
            self.fail(f"{where}.fields", f"an object with at least {sorted(required)}", fields)
        unknown = sorted(fields.keys() - set(_FIELDS))
        if unknown:
            self.fail(f"{where}.fields", f"fields among {list(_FIELDS)}", unknown)
        counter = "counter_keys" in fields or "counter_counts" in fields
        if counter and not {"counter_keys", "counter_counts"} <= fields.keys():
            self.fail(f"{where}.fields", "both counter_keys and counter_counts", sorted(fields))
        if counter != ("counter_rows" in entry):
            self.fail(f"{where}.counter_rows", "present exactly with the counter files", entry)
        if counter:
            self.int_in(f"{where}.counter_rows", entry["counter_rows"], 0)
        for field, f in fields.items():
            self.keys(f"{where}.fields.{field}", f, {"file", "bytes", "crc32"})
            self.file_name(f"{where}.fields.{field}.file", f["file"])
            self.int_in(f"{where}.fields.{field}.bytes", f["bytes"], 0)
            self.int_in(f"{where}.fields.{field}.crc32", f["crc32"], 0, (1 << 32) - 1)

    def file_name(self, where: str, name) -> None:
        """A plain file name: the file lies in the dump directory, nowhere else."""
        plain = (
            isinstance(name, str)
            and name not in ("", ".", "..")
            and "/" not in name
            and "\\" not in name
            and "\0" not in name
        )
        if not plain:
            self.fail(where, "a plain file name inside the dump directory (no '/', no '..')", name)


__all__ = [
    "FORMAT",
    "INT64_MAX",
    "MANIFEST",
    "SLICES_VERSION",
    "VERSION",
    "checksum",
    "read_manifest",
    "write_manifest",
]
