"""Checks of a checkpoint's files before a load changes anything: presence, size, CRC-32."""

import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from dynemb.dump_files.format import (
    VERIFY_BLOCK,
    CheckpointError,
    check_size,
    crc32_combine,
    crc32_of_range,
)


def field_bytes(dtype, width: int, rows: int) -> int:
    """Bytes of ``rows`` rows of a field of ``width`` columns (0: a 1-D field)."""
    return torch.empty((), dtype=dtype).element_size() * max(1, width) * rows


_VERIFY_PIECE = 64 << 20  # bytes of a file checked by one job


def verify_all(directory: Path, share: list) -> list[str]:
    """Checks this rank's share of the files (presence, size, CRC-32); returns the errors.

    ``share``: ``(table name, file entry, {field: (dtype, width)})`` of each file entry.

    Files are cut into pieces checked on two threads (reads and CRC-32 release the
    GIL), each reading into its own block reused from piece to piece; the pieces'
    CRCs are combined per file.
    """
    errors, files = [], []
    for name, entry, fields in share:
        wanted = {f: field_bytes(d, w, entry["rows"]) for f, (d, w) in fields.items()}
        for field in ("counter_keys", "counter_counts"):
            if field in entry["fields"]:
                wanted[field] = 8 * entry["counter_rows"]
        for field, nbytes in wanted.items():
            if field not in entry["fields"]:
                errors.append(f"{directory}: table {name!r} has no {field} file")
                continue
            try:
                check_size(directory, entry["fields"][field], nbytes)
                files.append(entry["fields"][field])
            except CheckpointError as e:
                errors.append(str(e))
    pieces = [
        (f, begin, min(_VERIFY_PIECE, f["bytes"] - begin))
        for f in files
        for begin in range(0, f["bytes"], _VERIFY_PIECE)
    ]
    blocks = threading.local()

    def crc_of(piece) -> int | str:
        if not hasattr(blocks, "block"):
            blocks.block = torch.empty(VERIFY_BLOCK, dtype=torch.uint8)
        file, begin, length = piece
        try:
            return crc32_of_range(directory / file["file"], begin, length, blocks.block)
        except OSError as e:  # reported like any bad file, so that every rank agrees
            return f"{directory / file['file']}: unreadable ({e})"

    with ThreadPoolExecutor(max_workers=2) as pool:
        crcs = iter(pool.map(crc_of, pieces))
    for f in files:
        starts = range(0, f["bytes"], _VERIFY_PIECE)
        parts = [next(crcs) for _ in starts]
        unreadable = [p for p in parts if isinstance(p, str)]
        if unreadable:
            errors.append(unreadable[0])
            continue
        crc = 0
        for begin, part in zip(starts, parts, strict=True):
            crc = crc32_combine(crc, part, min(_VERIFY_PIECE, f["bytes"] - begin))
        if crc != f["crc32"]:
            errors.append(f"{directory / f['file']}: checksum mismatch (corrupted)")
    return errors


__all__ = ["field_bytes", "verify_all"]
