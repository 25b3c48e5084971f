"""Dumps to one checkpoint directory, one at a time: the lock, and which dump directories
may be removed.

    <path>/.dynemb-dump.lock    an empty file; rank 0 of a dump holds an exclusive
                                flock(2) on it from before it creates its dump directory
                                until after its commit and clean-up (or its failure)

Two dumps to one path (threads of one process, processes, jobs) therefore run one
after the other: the second waits for the lock, and then writes its own directory and
commits after the first. Holding the lock, a dump may remove every ``dump-*``
directory except the committed one (the manifest's ``dump_id``): none can be in
progress, so each is a superseded checkpoint or the remains of a dump that died
(kill -9, a full disk). It removes them before writing (so that space freed by a dump
that failed is there for the next one) and after committing. When the manifest cannot
be read it removes nothing: it cannot tell which directory is the checkpoint.

A load holds the same lock shared (``load_lock``), so a dump's commit never removes the
dump directory a load is reading: the dump waits for the loads in progress, and a load
waits for the dump in progress, then reads what it committed.

The lock is advisory and needs a filesystem with working flock(2) across the
processes involved (local filesystems do; NFS maps it to its own locks). The kernel
releases it when its holder dies, so a killed dump never blocks the next one.
"""

import contextlib
import fcntl
import os
import shutil
from pathlib import Path

from dynemb.dump_files.format import CheckpointError
from dynemb.dump_files.manifest import MANIFEST, read_manifest

LOCK = ".dynemb-dump.lock"
DUMP_PREFIX = "dump-"


@contextlib.contextmanager
def dump_lock(path: Path):
    """Holds the exclusive dump lock of checkpoint directory ``path`` (created if
    needed) for the block; waits for a dump holding it to finish.

    Raises:
        OSError: naming ``path`` or the lock file when either cannot be created.
    """
    file = path / LOCK
    try:
        path.mkdir(parents=True, exist_ok=True)
        fd = os.open(file, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
        raise OSError(e.errno, f"DynamicEmbDump: cannot create {file}: {e.strerror}") from e
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


@contextlib.contextmanager
def load_lock(path: Path):
    """Holds the dump lock of ``path`` shared for the block (see the module's docstring).
    Where the lock file cannot be created nor opened (a read-only checkpoint, one that
    does not exist), the block runs without it: no dump can run there either."""
    fd = None
    for flags in (os.O_RDWR | os.O_CREAT, os.O_RDONLY):
        try:
            fd = os.open(path / LOCK, flags, 0o644)
            break
        except OSError:
            continue
    if fd is None:
        yield
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
        yield
    finally:
        os.close(fd)


def holds_checkpoint(path: Path) -> bool:
    """Whether ``path`` holds anything but the dump lock (a checkpoint, other files)."""
    return path.is_dir() and any(child.name != LOCK for child in path.iterdir())


def committed_dump_id(path: Path) -> str | None:
    """The manifest's ``dump_id``, or None (no manifest, or one that cannot be read)."""
    if not (path / MANIFEST).is_file():
        return None
    try:
        return read_manifest(path)["dump_id"]
    except CheckpointError:
        return None


def remove_superseded_dumps(path: Path, keep: str | None = None) -> list[str]:
    """Removes every dump directory of ``path`` but the committed one and ``keep``
    (call it holding ``dump_lock``); returns the names removed.

    Nothing is removed when ``path`` has a manifest that cannot be read (nothing tells
    which directory is the checkpoint); without a manifest every dump directory is an
    incomplete dump.
    """
    committed = committed_dump_id(path)
    if committed is None and (path / MANIFEST).exists():
        return []
    removed = []
    for child in sorted(path.iterdir()):
        if (
            child.name.startswith(DUMP_PREFIX)
            and child.name not in (committed, keep)
            and child.is_dir()
            and not child.is_symlink()
        ):
            shutil.rmtree(child, ignore_errors=True)
            removed.append(child.name)
    return removed


__all__ = [
    "LOCK",
    "committed_dump_id",
    "dump_lock",
    "holds_checkpoint",
    "load_lock",
    "remove_superseded_dumps",
]
