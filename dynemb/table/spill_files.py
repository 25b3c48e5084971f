"""Table buffers backed by memory-mapped files on local disk (the spill tier).

A table opened with a ``spill_directory`` keeps its slot buffers (digests, keys,
scores, slow-tier rows, overflow flags) in files under that directory, mapped
shared: the operating system pages them in and out, so a table may be larger
than RAM and is still addressed like memory by the same C++ ops. Only the bucket
locks (transient) and a hybrid table's fast-tier rows stay in anonymous memory;
``flush`` writes those rows beside the others and syncs every mapping, after
which the directory reopens as the same table.

Layout of a spill directory::

    table.json               the committed state: layout, bucket count, step
    lock                     held (flock) by the live table using the directory
    g<generation>/<buffer>   one file per buffer of the storage of that generation

Growth writes a new generation directory and removes the old one once the rehash
is complete; ``table.json`` is replaced atomically (write, fsync, rename) by
``flush``, so a reopen after a crash finds the last flushed generation intact only
if no growth happened since; the spill tier is a working area, checkpoints
(``DynamicEmbDump``) are the durable copy.
"""

import fcntl
import json
import mmap
import os
import shutil
import warnings

import torch

META_FILE = "table.json"
# 2: a NO_EVICTION key may sit in its second bucket (csrc/core/hash.h second_bucket_of);
# version 1 put it in the next buckets, where this version does not look.
# 3: the overflow buffer holds bucket flags, among them one that a slot of the bucket
# was erased (csrc/core/bucket.h "Holes"), which version 2 did not keep: a version-2
# directory is converted as it is opened (spill_persistence.reopen).
FORMAT_VERSION = 3
UPGRADABLE_VERSION = 2


def buffer_bytes(shape: tuple, dtype: torch.dtype) -> int:
    """Bytes of a buffer of ``shape`` and ``dtype``: the size of its file."""
    numel = 1
    for s in shape:
        numel *= s
    return numel * torch.empty((), dtype=dtype).element_size()


def saved_size_error(path: str, shape: tuple, dtype: torch.dtype) -> str | None:
    """Why the file ``path`` cannot be reopened as a buffer of ``shape`` and ``dtype``
    (its size is not the buffer's), or None. A buffer of no bytes has no file."""
    nbytes = buffer_bytes(shape, dtype)
    what = f"a {tuple(shape)} {dtype} buffer, as table.json implies"
    try:
        size = os.stat(path).st_size
    except FileNotFoundError:
        return None if nbytes == 0 else f"{path}: missing, expected {nbytes} bytes ({what})"
    if size != nbytes:
        return (
            f"{path}: {size} bytes, expected {nbytes} ({what}): truncated or extended; "
            "refused, the file is left as it is"
        )
    return None


class MappedBuffer:
    """A tensor whose memory is a shared mapping of the file ``path``: ``create`` makes a
    new zero-filled file, ``reopen`` maps a flushed one as it is."""

    def __init__(self, path: str, tensor: torch.Tensor, mapping: mmap.mmap | None) -> None:
        self.path = path
        self.tensor = tensor
        self._mmap = mapping

    @classmethod
    def create(cls, path: str, shape: tuple, dtype: torch.dtype) -> "MappedBuffer":
        """A new buffer, zero-filled; whatever ``path`` held is discarded (a generation
        left by a growth that never committed must not lend its slots to this one)."""
        if buffer_bytes(shape, dtype) == 0:
            return cls(path, torch.empty(shape, dtype=dtype), None)
        with open(path, "w+b") as f:  # emptied, then sized: sparse, zero-filled
            f.truncate(buffer_bytes(shape, dtype))
            return cls._map(path, f, shape, dtype)

    @classmethod
    def reopen(cls, path: str, shape: tuple, dtype: torch.dtype) -> "MappedBuffer":
        """The flushed buffer ``path`` holds, mapped as it is.

        Raises:
            ValueError: the file's size is not the buffer's (``saved_size_error``);
                nothing is mapped or changed.
        """
        if error := saved_size_error(path, shape, dtype):
            raise ValueError(error)
        if buffer_bytes(shape, dtype) == 0:
            return cls(path, torch.empty(shape, dtype=dtype), None)
        with open(path, "r+b") as f:
            return cls._map(path, f, shape, dtype)

    @classmethod
    def _map(cls, path: str, f, shape: tuple, dtype: torch.dtype) -> "MappedBuffer":
        mapping = mmap.mmap(f.fileno(), buffer_bytes(shape, dtype), access=mmap.ACCESS_WRITE)
        with warnings.catch_warnings():  # frombuffer warns about non-resizable buffers
            warnings.simplefilter("ignore")
            flat = torch.frombuffer(mapping, dtype=dtype)
        return cls(path, flat.view(shape), mapping)

    def sync(self) -> None:
        """Writes the mapping's dirty pages to the file (msync)."""
        if self._mmap is not None:
            self._mmap.flush()


class SpillDirectory:
    """The files of one spilled table: buffers per generation and the metadata.

    One live table per directory: an exclusive lock (flock on ``lock``) is held
    from construction until this object is garbage-collected, since two tables
    mapping the same files would silently change each other.
    """

    def __init__(self, path: str) -> None:
        if not isinstance(path, (str, os.PathLike)):
            raise TypeError(f"spill_directory must be a path, got {path!r}")
        self.path = os.fspath(path)
        os.makedirs(self.path, exist_ok=True)
        self._lock_fd = os.open(os.path.join(self.path, "lock"), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._lock_fd)
            self._lock_fd = None
            raise ValueError(
                f"spill_directory {self.path!r} is in use by another live table "
                "(delete that table first)"
            ) from None

    def __del__(self) -> None:
        if getattr(self, "_lock_fd", None) is not None:
            os.close(self._lock_fd)  # releases the flock
            self._lock_fd = None

    def generation_dir(self, generation: int) -> str:
        return os.path.join(self.path, f"g{generation}")

    def create_buffer(
        self, generation: int, name: str, shape: tuple, dtype: torch.dtype
    ) -> MappedBuffer:
        """A new zero-filled buffer ``name`` of generation ``generation`` (MappedBuffer.create)."""
        directory = self.generation_dir(generation)
        os.makedirs(directory, exist_ok=True)
        return MappedBuffer.create(os.path.join(directory, name), shape, dtype)

    def reopen_buffer(
        self, generation: int, name: str, shape: tuple, dtype: torch.dtype
    ) -> MappedBuffer:
        """The flushed buffer ``name`` of generation ``generation`` (MappedBuffer.reopen).

        Raises:
            ValueError: naming the spill directory, the file, its size and the size
                expected; nothing changes.
        """
        path = os.path.join(self.generation_dir(generation), name)
        try:
            return MappedBuffer.reopen(path, shape, dtype)
        except ValueError as e:
            raise ValueError(f"spill directory {self.path!r}: {e}") from None

    def remove_generations_except(self, keep: int) -> None:
        for entry in os.listdir(self.path):
            if entry.startswith("g") and entry[1:].isdigit() and int(entry[1:]) != keep:
                shutil.rmtree(os.path.join(self.path, entry), ignore_errors=True)

    def read_meta(self) -> dict | None:
        """The committed metadata, or None for a fresh directory."""
        meta_path = os.path.join(self.path, META_FILE)
        if not os.path.exists(meta_path):
            return None
        with open(meta_path) as f:
            meta = json.load(f)
        if meta.get("version") not in (UPGRADABLE_VERSION, FORMAT_VERSION):
            raise ValueError(
                f"spill directory {self.path!r}: format version {meta.get('version')!r}, "
                f"expected {FORMAT_VERSION} or {UPGRADABLE_VERSION} (converted as it opens; "
                f"the slot layout differs: load the table from a checkpoint, whose format "
                f"does not depend on slots)"
            )
        return meta

    def write_meta(self, meta: dict) -> None:
        """Replaces the metadata atomically (temporary file, fsync, rename, fsync dir)."""
        meta = {"version": FORMAT_VERSION, **meta}
        tmp = os.path.join(self.path, META_FILE + ".tmp")
        with open(tmp, "w") as f:
            json.dump(meta, f, indent=1, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, os.path.join(self.path, META_FILE))
        fd = os.open(self.path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
