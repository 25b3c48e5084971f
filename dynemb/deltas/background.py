"""``BackgroundWriter``: runs write jobs on one thread, one at a time, in the order they
were submitted, at most ``max_pending`` at once (the one being written included).

A job that raises stops the writer: the jobs behind it are not run (a later delta
must not commit over a missing one), and the submitting thread collects the failure
and the jobs left behind with ``take_failure``, after which the writer runs new jobs
again. So an error is never lost: it waits until the submitter asks.

The thread is a daemon (an interpreter that exits without waiting abandons a pending
job: written files are committed by a rename, so nothing half-written is visible); it
starts with the first job and ends with ``stop``.
"""

import collections
import dataclasses
import threading
from collections.abc import Callable
from typing import Any


@dataclasses.dataclass
class Job:
    """``run()`` writes; ``tag`` is the submitter's (what to do if it fails)."""

    run: Callable[[], None]
    tag: Any


@dataclasses.dataclass
class Failure:
    """The job that raised, its exception, and the jobs submitted after it (not run)."""

    job: Job
    error: BaseException
    cancelled: list[Job]


class BackgroundWriter:
    """One writer thread (see the module)."""

    def __init__(self, max_pending: int, name: str) -> None:
        self.max_pending = max_pending
        self._name = name
        self._cond = threading.Condition()
        self._jobs: collections.deque[Job] = collections.deque()  # the head is running
        self._failed: tuple[Job, BaseException] | None = None
        self._stopping = False
        self._thread: threading.Thread | None = None

    @property
    def pending(self) -> int:
        """Jobs submitted and not finished (the one being written included)."""
        with self._cond:
            return len(self._jobs)

    def wait_below(self, limit: int) -> None:
        """Waits until fewer than ``limit`` jobs are pending, or a job failed
        (``limit`` 1: every job finished)."""
        with self._cond:
            while len(self._jobs) >= limit and self._failed is None:
                self._cond.wait()

    def submit(self, job: Job) -> None:
        """Queues ``job`` behind the pending ones; call ``wait_below(max_pending)`` and
        ``take_failure`` first (submit itself does not wait)."""
        with self._cond:
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name=self._name, daemon=True)
                self._thread.start()
            self._jobs.append(job)
            self._cond.notify_all()

    def take_failure(self) -> Failure | None:
        """The failure, if a job raised (the writer then runs new jobs again), else None."""
        with self._cond:
            if self._failed is None:
                return None
            job, error = self._failed
            cancelled = list(self._jobs)
            self._jobs.clear()
            self._failed = None
            self._cond.notify_all()
        return Failure(job, error, cancelled)

    def stop(self) -> None:
        """Ends the thread once the pending jobs finished (or one failed)."""
        self.wait_below(1)
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
            thread = self._thread
        if thread is not None:
            thread.join()

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._stopping and (not self._jobs or self._failed is not None):
                    self._cond.wait()
                if self._stopping:
                    return
                job = self._jobs[0]
            try:
                job.run()
            except BaseException as e:  # noqa: BLE001 - handed to the submitter, never lost
                with self._cond:
                    self._failed = (self._jobs.popleft(), e)
                    self._cond.notify_all()
                continue
            with self._cond:
                self._jobs.popleft()
                self._cond.notify_all()


__all__ = ["BackgroundWriter", "Failure", "Job"]
