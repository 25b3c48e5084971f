"""``BackgroundWriter``: runs write jobs on one thread, one at a time, in the order they
were submitted, at most ``max_pending`` at once (the one being written included).

A job that raises stops the writer: the jobs behind it are not run (a later delta
must not commit over a missing one), and the submitting thread collects the failure
and the jobs left behind with ``take_failure``, after which the writer runs new jobs
again. So an error is never lost: it waits until the submitter asks.

Between jobs the thread calls ``idle`` every ``idle_seconds`` (the publisher compacts
its change logs there); an error it raises is kept like a job's.

The thread runs at nice WRITER_NICE. It is a daemon (an interpreter that exits without waiting abandons a pending
job: written files are committed by a rename, so nothing half-written is visible); it
starts with ``start`` or the first job and ends with ``stop``.
"""

import collections
import contextlib
import dataclasses
import os
import threading
from collections.abc import Callable
from typing import Any

# The writer thread's niceness (Linux, where a thread has its own): training threads
# come first for a core; the write waits. Measured on W-train (bench_deltas.py, a
# loaded 2-core machine, 100-step runs with one delta, the capture included and the
# writes pending at the end not): step time 1.63x that without publication at nice 0,
# 1.37x at 19.
WRITER_NICE = 19


@dataclasses.dataclass
class Job:
    """``run()`` writes; ``tag`` is the submitter's (what to do if it fails)."""

    run: Callable[[], None]
    tag: Any


@dataclasses.dataclass
class Failure:
    """The job that raised (its tag None: ``idle`` raised), its exception, and the jobs
    submitted after it (not run)."""

    job: Job
    error: BaseException
    cancelled: list[Job]


class BackgroundWriter:
    """One writer thread (see the module)."""

    def __init__(
        self,
        max_pending: int,
        name: str,
        idle: Callable[[], None] | None = None,
        idle_seconds: float = 0.1,
    ) -> None:
        self.max_pending = max_pending
        self._name = name
        self._idle = idle
        self._idle_seconds = idle_seconds
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

    def start(self) -> None:
        """Starts the thread (if not yet)."""
        with self._cond:
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name=self._name, daemon=True)
                self._thread.start()

    def submit(self, job: Job) -> None:
        """Queues ``job`` behind the pending ones; call ``wait_below(max_pending)`` and
        ``take_failure`` first (submit itself does not wait)."""
        self.start()
        with self._cond:
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
        with contextlib.suppress(OSError, AttributeError):  # Linux: a thread's own
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), WRITER_NICE)
        while True:
            with self._cond:
                job = None
                while not self._stopping:
                    if self._jobs and self._failed is None:
                        job = self._jobs[0]
                        break
                    timeout = self._idle_seconds if self._idle is not None else None
                    if not self._cond.wait(timeout) and not self._jobs and self._failed is None:
                        break  # idle for idle_seconds
                if self._stopping:
                    return
            try:
                (self._idle if job is None else job.run)()
            except BaseException as e:  # handed to the submitter, never lost
                with self._cond:
                    done = self._jobs.popleft() if job is not None else Job(lambda: None, None)
                    self._failed = (done, e)
                    self._cond.notify_all()
                continue
            if job is not None:
                with self._cond:
                    self._jobs.popleft()
                    self._cond.notify_all()


__all__ = ["BackgroundWriter", "Failure", "Job"]
