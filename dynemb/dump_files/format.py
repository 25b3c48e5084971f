"""On-disk layout of a dynemb checkpoint, and its validation.

    <path>/manifest.json           the commit point: written last, renamed into place
    <path>/<dump_id>/<table>.r<rank>.<field>   raw little-endian arrays, one per field

Fields of a table's file set (``rows`` entries each): ``keys`` int64, ``values``
(dim columns) and ``state`` (the optimizer's extra columns, with ``optim=True``)
in the table's value dtype, ``scores`` int64, ``timestamps`` int64 (the
(TIMESTAMP, LFU) compound only). The manifest records, per table, its options and
per file its row count, byte size and CRC-32. A dump writes a fresh ``<dump_id>``
directory and only then replaces the manifest, so the previous checkpoint stays
loadable until the new one is complete; a dump directory that the manifest does not
name is an incomplete dump and is never read (manifest.py: the manifest, its
checksum and schema; dump_lock.py: who may remove which dump directory).
"""

import contextlib
import os
from pathlib import Path

import torch

from dynemb import _ops

CHUNK_ROWS = 1 << 16  # rows per read / write: memory stays bounded for any table size

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


class CheckpointError(ValueError):
    """A checkpoint that cannot be loaded (missing, incomplete, corrupted or mismatched)."""


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def dtype_of(name: str) -> torch.dtype:
    if name not in _DTYPES:
        raise CheckpointError(f"unknown value dtype {name!r} in the manifest")
    return _DTYPES[name]


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_error(file: Path, e: OSError) -> OSError:
    """``e`` (same errno) with a message naming ``file``, the file a dump was writing."""
    return OSError(e.errno, f"DynamicEmbDump: writing {file} failed: {e.strerror or e}")


class FieldWriter:
    """Appends raw arrays to one field file, keeping its size and CRC-32.

    Every OSError (a full disk: ENOSPC, a quota, an I/O error) is raised again as an
    OSError with the same errno and a message naming the file.
    """

    def __init__(self, file: Path) -> None:
        self.file = file
        try:
            self._f = open(file, "wb")
        except OSError as e:
            raise write_error(file, e) from e
        self.bytes = 0
        self.crc = 0

    def write(self, t: torch.Tensor) -> None:
        if not t.is_contiguous() and t.dim() == 2:
            # A column slice (a delta's values): CHUNK_ROWS rows at a time through one
            # reused buffer. A contiguous copy of the whole would be a fresh output
            # as large, page-faulted in, which cost more than the copy.
            chunk = torch.empty((min(CHUNK_ROWS, t.shape[0]), t.shape[1]), dtype=t.dtype)
            for part in t.split(CHUNK_ROWS):
                self._write_raw(chunk[: part.shape[0]].copy_(part).view(torch.uint8).reshape(-1))
            return
        self._write_raw(t.contiguous().view(torch.uint8).reshape(-1))

    def _write_raw(self, raw: torch.Tensor) -> None:
        if raw.numel():
            try:
                self._f.write(raw.numpy())  # the tensor's own bytes: no copy
            except OSError as e:
                with contextlib.suppress(OSError):
                    self._f.close()
                raise write_error(self.file, e) from e
            self.crc = _ops.crc32(raw, self.crc)
            self.bytes += raw.numel()

    def abort(self) -> None:
        """Closes the file without checking anything (a failed dump: its space must not
        stay held by an open descriptor once the directory is removed)."""
        with contextlib.suppress(OSError):
            self._f.close()

    def close(self) -> dict:
        try:
            with self._f:
                self._f.flush()
                os.fsync(self._f.fileno())
        except OSError as e:
            raise write_error(self.file, e) from e
        return {"file": self.file.name, "bytes": self.bytes, "crc32": self.crc}


def check_inside(directory: Path, name: str) -> Path:
    """``directory / name``, after checking that it resolves inside ``directory`` (a
    symbolic link out of the checkpoint is refused).

    Raises:
        CheckpointError: naming the file and where it leads.
    """
    file = directory / name
    target = file.resolve()
    if not target.is_relative_to(directory.resolve()):
        raise CheckpointError(
            f"{file}: leads to {target}, outside the checkpoint directory {directory}; refused"
        )
    return file


VERIFY_BLOCK = 16 << 20  # bytes per read while checking a file
_CRC_POLY = 0xEDB88320  # CRC-32 (zlib's), bit-reflected


def check_size(directory: Path, entry: dict, expected_bytes: int) -> None:
    """Raises CheckpointError naming the file if it is missing or has the wrong size.

    Args:
        directory: the dump directory.
        entry: the manifest's ``{"file", "bytes", "crc32"}`` of the file.
        expected_bytes: the size the table's options and row count imply.
    """
    file = directory / entry["file"]
    if not file.is_file():
        raise CheckpointError(f"{file}: missing")
    check_inside(directory, entry["file"])
    if not file.is_file():
        raise CheckpointError(f"{file}: missing")
    size = file.stat().st_size
    if entry["bytes"] != expected_bytes:  # the manifest contradicts itself
        raise CheckpointError(
            f"{file}: the manifest records {entry['bytes']} bytes for it, its row count and "
            f"the table's options imply {expected_bytes}: manifest.json is inconsistent"
        )
    if size != expected_bytes:
        raise CheckpointError(
            f"{file}: {size} bytes, the manifest expects {expected_bytes} (truncated or extended)"
        )


def crc32_of_range(file: Path, begin: int, length: int, block: torch.Tensor) -> int:
    """CRC-32 of bytes [begin, begin + length) of ``file`` (fewer if the file is shorter).

    ``block``: (VERIFY_BLOCK,) uint8 scratch memory, reused from call to call (a fresh
    buffer per read would page-fault on every byte it receives).
    """
    crc, raw = 0, memoryview(block.numpy())
    with open(file, "rb", buffering=0) as f:
        f.seek(begin)
        while length > 0 and (n := f.readinto(raw[: min(length, len(raw))])):
            crc = _ops.crc32(block[:n], crc)  # zlib's value, ~10x faster, without the GIL
            length -= n
    return crc


def _multiply_mod_p(a: int, b: int) -> int:
    """a * b modulo the CRC polynomial (bit-reflected, as zlib's multmodp)."""
    product, m = 0, 1 << 31
    while m:
        if a & m:
            product ^= b
        m >>= 1
        b = (b >> 1) ^ _CRC_POLY if b & 1 else b >> 1
    return product


def crc32_combine(crc1: int, crc2: int, length2: int) -> int:
    """The CRC-32 of A + B from crc1 = CRC(A), crc2 = CRC(B) and len(B) (zlib's crc32_combine)."""
    x_power, square = 1 << 31, 1 << 30  # x^0; x^(2^0) shifted for bytes below
    shift = length2 * 8  # multiply crc1 by x^(8 * len(B))
    while shift:
        if shift & 1:
            x_power = _multiply_mod_p(square, x_power)
        square = _multiply_mod_p(square, square)
        shift >>= 1
    return _multiply_mod_p(x_power, crc1) ^ crc2


def read_rows(
    directory: Path, entry: dict, begin: int, end: int, dtype, width: int
) -> torch.Tensor:
    """Rows [begin, end) of a field file as a new (end - begin, width) tensor (width 0: 1-D)."""
    out = torch.empty((end - begin, width) if width else (end - begin,), dtype=dtype)
    read_rows_into(directory, entry, begin, out)
    return out


def read_rows_into(directory: Path, entry: dict, begin: int, out: torch.Tensor) -> None:
    """Fills ``out`` ((m, width) or (m,), contiguous) with rows [begin, begin + m) of a field
    file: one copy, from the kernel straight into the tensor."""
    raw = memoryview(out.view(torch.uint8).reshape(-1).numpy())
    row_bytes = out.element_size() * (out.shape[1] if out.dim() == 2 else 1)
    got = 0
    with open(directory / entry["file"], "rb", buffering=0) as f:
        f.seek(begin * row_bytes)
        while got < len(raw) and (n := f.readinto(raw[got:])):
            got += n
    if got != len(raw):
        raise CheckpointError(f"{directory / entry['file']}: shorter than the manifest says")
