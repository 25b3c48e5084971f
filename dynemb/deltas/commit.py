"""The outcome of a delta write: ``DeltaCommit``, the record of a committed delta
(DeltaPublisher.commits), or the error that a failed background write raises."""

import dataclasses
from pathlib import Path


@dataclasses.dataclass(frozen=True)
class DeltaCommit:
    """A committed delta: its ``version`` and ``path``, the ``bytes`` of its arrays,
    ``capture_seconds`` (reading the tables, on the training thread; over several
    processes, gathering them to rank 0 too) and ``write_seconds`` (writing,
    checksumming, fsync and commit; on the writer thread for a background delta).
    Over several processes ``bytes`` and ``write_seconds`` are rank 0's (0 on the
    others). ``entries_before``: entries read between deltas by the writer thread
    (pre-capture, single process; a key read twice counts twice), ``entries_at_boundary``:
    read at the boundary (this rank's)."""

    version: int
    path: Path
    bytes: int
    capture_seconds: float
    write_seconds: float
    entries_before: int = 0
    entries_at_boundary: int = 0


def failed_write_error(error: BaseException, path: Path, version: int, cancelled: int):
    """The error DeltaPublisher raises for a background write of ``path`` that failed
    with ``error`` (``cancelled`` deltas were pending behind it): an OSError of the
    same class and errno naming the file, else a RuntimeError."""
    later = f" and the {cancelled} pending after it" if cancelled else ""
    message = (
        f"DeltaPublisher: the background write of {path} failed ({error}); nothing of it"
        f"{later} is committed: their changes go into the next delta (version {version})"
    )
    if isinstance(error, OSError):
        return type(error)(*((message,) if error.errno is None else (error.errno, message)))
    return RuntimeError(message)
