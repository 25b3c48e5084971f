"""``DeltaPublisher``: training publishes a base checkpoint, then versioned deltas of
what its dynamic tables changed since the previous one.

How the changes are found: the publisher attaches a ``ChangeLog``
(dynemb/table/change_log.py) to every dynamic table of the model, which records the
keys each upsert stores and each key that leaves (evicted by an upsert, erased,
cleared). A delta holds, per table, the current row (and score, optimizer state with
``optim``) of every key touched since the previous delta and still stored, and a
tombstone for every key removed and not stored again. Unlike a score threshold (the
incremental dump's), the log is exact under every score strategy (LFU counts and
CUSTOMIZED scores say nothing of time; NO_EVICTION keeps no score), and a delta
costs time and space in proportion to the keys touched, not to the table.
"""

import collections
import time
from pathlib import Path

import torch.distributed as dist
from torch import nn

from dynemb.checkpoint.tables import named_tables
from dynemb.checkpoint.writer import DynamicEmbDump, committed_dump
from dynemb.deltas.background import BackgroundWriter, Job
from dynemb.deltas.buffers import CaptureBuffers
from dynemb.deltas.capture import Capture, delta_bytes, entries, restore, table_meta
from dynemb.deltas.commit import DeltaCommit, failed_write_error
from dynemb.deltas.format import delta_path, write_delta
from dynemb.deltas.precapture import PreCapture
from dynemb.deltas.precapture import merge as merge_entries
from dynemb.deltas.ranks import agree_on_tables, column_slice, publish_collective
from dynemb.distributed.collectives import process_group
from dynemb.distributed.rank_faults import DEFAULT_TIMEOUT_S, RankAgreement
from dynemb.table.change_log import ChangeLog

BASE = "base"
COMMITS_KEPT = 1024  # DeltaPublisher.commits: the latest commits
COMPACT_PARTS = 16  # a change log is compacted once it holds this many tensors


class DeltaPublisher:
    """Publishes a model's dynamic tables as a base checkpoint plus versioned deltas.

    Creating it starts tracking (nothing is tracked without one); ``close`` stops.
    Call ``publish_base`` once, then ``publish`` at batch boundaries (after the
    optimizer step), from the training thread; ``publish(background=True)`` writes
    the delta on a writer thread while training goes on.

    A model sharded over several processes (any sharding type): every rank of ``pg``
    creates the publisher (a collective) and calls ``publish_base`` and ``publish``
    (collectives) at the same batch boundaries. Rank 0 gathers the ranks' changes and
    writes the one delta of whole rows (dynemb/deltas/ranks.py); every rank returns the same version or raises the same error, and no
    change is lost on a failure. Background publication is single-process only.

    Args:
        model: a (DMP-)sharded model, a sharded collection, or a
            BatchedDynamicEmbeddingTables.
        directory: where ``base/`` (a DynamicEmbDump checkpoint) and ``delta-<N>/``
            are written (created if needed).
        optim: also publish each upserted row's optimizer state.
        max_pending: at most this many background deltas are pending (written or
            waiting to be); a ``publish`` beyond waits for the oldest. Each holds a
            copy of its rows in host memory until written.
        pg: the process group of the model's ranks (default: the world, if initialized).
        fault_timeout: (several processes) seconds after which a rank that stopped
            responding in a collective step counts as dead: the others raise
            RankFailure naming it (dynemb/distributed/rank_faults.py).
        precapture: (single process) the writer thread reads most of each delta
            between deltas, while training goes on, and the boundary only the keys of
            the last steps (dynemb/deltas/precapture.py): a shorter stop at the
            boundary for more host memory and memory traffic beside training. Off by
            default: on W-train with 2 cores it made training slower overall
            (bench_deltas.py; DynamicEmb_APIs.md, "Background publication").

    Raises:
        TypeError: ``precapture`` is not a bool.
        ValueError: ``max_pending`` is not an integer >= 1, the model has no dynamic
            table, a table is in caching mode (its rows move between tiers; not
            supported), a table is already tracked by another publisher, or the ranks
            hold different dynamic tables (on every rank, when one rank's check fails).

    Example::

        >>> publisher = DeltaPublisher(model, "/deltas")
        >>> publisher.publish_base()            # version 0: /deltas/base
        >>> for step, batch in enumerate(loader, 1):
        ...     train_step(batch)
        ...     if step % 100 == 0:
        ...         publisher.publish(background=True)  # 1, 2, ...: /deltas/delta-00000001
        >>> publisher.close()                   # waits for the pending deltas
    """

    def __init__(
        self,
        model: nn.Module,
        directory: str | Path,
        optim: bool = False,
        max_pending: int = 2,
        pg: dist.ProcessGroup | None = None,
        fault_timeout: float = DEFAULT_TIMEOUT_S,
        precapture: bool = False,
    ) -> None:
        if not isinstance(precapture, bool):
            raise TypeError(f"DeltaPublisher: precapture must be a bool, got {precapture!r}")
        if isinstance(max_pending, bool) or not isinstance(max_pending, int) or max_pending < 1:
            raise ValueError(
                f"DeltaPublisher: max_pending must be an integer >= 1, got {max_pending!r}"
            )
        if (
            isinstance(fault_timeout, bool)
            or not isinstance(fault_timeout, int | float)
            or not fault_timeout > 0
        ):
            raise ValueError(
                "DeltaPublisher: fault_timeout must be a positive number of seconds, "
                f"got {fault_timeout!r}"
            )
        pg = process_group(pg)
        several = pg is not None and dist.get_world_size(pg) > 1
        tables = named_tables(model)
        error = _check_tables(tables)
        if not several and error is not None:
            raise ValueError(error)
        if several:  # every rank raises if one rank's check fails
            with RankAgreement(pg, "DeltaPublisher", fault_timeout) as ranks:
                metas = {}
                for t in tables if error is None else ():
                    metas[t.name] = column_slice(t, table_meta(t.table), True)[0]
                agree_on_tables(ranks, pg, error, metas)
        self.model = model
        self.pg = pg
        self._several = several
        self.fault_timeout = fault_timeout
        self.directory = Path(directory)
        self.optim = optim
        self.version: int | None = None  # None until publish_base; pending deltas counted
        self.base_dump_id: str | None = None
        self.commits: collections.deque[DeltaCommit] = collections.deque(maxlen=COMMITS_KEPT)
        self._committed: int | None = None
        self._tables = tables
        self._writer = BackgroundWriter(
            max_pending, f"DeltaPublisher {self.directory}", idle=self._between_deltas
        )
        self._buffers = CaptureBuffers()  # a capture's host buffers, reused (buffers.py)
        self._capture = Capture(tables, optim, self._buffers)  # the reads (capture.py)
        # Single process: the writer thread reads between deltas (precapture.py).
        self._precapture = PreCapture(tables, optim, self._buffers.take)
        self._precapturing = precapture and not several
        self._closed = False
        for t in tables:
            t.table.change_log = ChangeLog()

    @property
    def base_path(self) -> Path:
        return self.directory / BASE

    @property
    def committed_version(self) -> int | None:
        """The last version on disk (``version`` counts the pending ones too)."""
        return self._committed

    @property
    def pending(self) -> int:
        """Deltas published in the background and not yet committed (or failed)."""
        return self._writer.pending

    def publish_base(self) -> int:
        """Writes the full checkpoint ``<directory>/base`` (DynamicEmbDump, dynemb's
        format, ``optim`` as given) and starts the chain: returns version 0.

        The base is written on the calling thread (training waits): see "Background
        publication" in DynamicEmb_APIs.md for why.

        Raises:
            ValueError: a base was published already by this publisher, or it is closed.
            FileExistsError: ``<directory>/base`` holds a checkpoint already.
        """
        self._check_open("publish_base")
        if self.version is not None:
            raise ValueError(
                f"DeltaPublisher.publish_base: the base is published (now at version {self.version})"
            )
        for t in self._tables:  # what changed before the base is in the base
            t.table.change_log.take()
        DynamicEmbDump(
            self.base_path,
            self.model,
            optim=self.optim,
            pg=self.pg,
            fault_timeout=self.fault_timeout,
        )
        self.base_dump_id = committed_dump(self.base_path)
        self._precapture.start()
        self.version = self._committed = 0
        self._writer.start()  # compacts the logs between deltas
        return 0

    def publish(self, background: bool = False) -> int:
        """Publishes the next delta (every change since the previous one); returns its
        version (1, 2, ...).

        The delta's content is the state now (the batch boundary: the rows, scores,
        optimizer state and timestamps of the keys touched, copied into host memory of
        the publisher's own). With ``precapture``, most of it was read by the writer
        thread while training went on; the calling thread reads the keys recorded
        since the last seal. With
        ``background=False`` it is then written and committed before returning; with
        ``background=True`` a writer thread writes it while training goes on: deltas
        commit in version order, at most ``max_pending`` are pending (this call waits
        for the oldest when that many are), and ``wait``/``close`` wait for them all.

        Raises:
            ValueError: no base published yet, the publisher is closed, or
                ``background=True`` over several processes.
            RankFailure: (several processes) another rank failed or died during the
                publication, or rank 0's write failed with an error that is not an
                OSError; the changes stay in the next delta on every rank. Rank 0's
                OSError is raised on rank 0 as is, on the others as an OSError of the
                same built-in class and errno naming it.
            OSError: a file could not be written (naming it): nothing is committed, and
                the changes stay in the next delta. A background write that failed is
                raised by the next ``publish``, ``wait`` or ``close`` (an OSError of the
                same class and errno naming the file, or RuntimeError for any other
                error), with the same guarantee: its changes, and those of the deltas
                pending behind it (not written), go into the next delta, which takes
                the failed version number.
            TypeError: ``background`` is not a bool.
        """
        if not isinstance(background, bool):
            raise TypeError(
                f"DeltaPublisher.publish: background must be a bool, got {background!r}"
            )
        self._check_open("publish")
        if self.version is None:
            raise ValueError("DeltaPublisher.publish: call publish_base() first")
        if self._several:
            if background:
                raise ValueError(
                    f"DeltaPublisher.publish: background=True is for single-process models; "
                    f"this one spans {dist.get_world_size(self.pg)} processes (publish with "
                    "background=False)"
                )
            return self._publish_collective()
        # A blocking delta commits after the pending ones: its version follows theirs.
        self._writer.wait_below(self._writer.max_pending if background else 1)
        self._raise_failure()
        try:
            return self._publish_local(background)
        finally:
            self._precapture.resume()  # training goes on: the next interval starts

    def _publish_local(self, background: bool) -> int:
        """``publish`` in a single process (see there)."""
        start = time.perf_counter()
        with self._precapture.lock:  # the writer thread reads no table meanwhile
            staged, inflight = self._precapture.take()
            reads, fresh = self._capture.at_boundary(inflight, staged)
            taken = (reads, staged)  # what a failed delta puts back in the logs
        version = self.version + 1
        capture = time.perf_counter() - start

        def write() -> None:
            begin = time.perf_counter()
            tables = {}
            try:  # each key's latest entry: the generations read between deltas, then now
                tables = {
                    name: (meta, merge_entries([*staged[name], delta], self._buffers.out(name)))
                    for name, (meta, delta) in fresh.items()
                }
                path = write_delta(self.directory, version, self.base_dump_id, self.optim, tables)
            finally:
                self._capture.give_back(fresh)
                self._capture.give_back(tables)
                for d in (d for ds in staged.values() for d in ds):
                    self._buffers.give_delta(d)
            self._committed = version
            size = sum(delta_bytes(d) for _, d in tables.values())
            self.commits.append(
                DeltaCommit(
                    version,
                    path,
                    size,
                    capture,
                    time.perf_counter() - begin,
                    entries(d for ds in staged.values() for d in ds),
                    entries(d for _, d in fresh.values()),
                )
            )

        if background:
            self._writer.submit(Job(write, (version, taken)))
        else:
            try:
                write()
            except BaseException:
                restore(taken)
                raise
        self.version = version
        return version

    def _publish_collective(self) -> int:
        """``publish`` over several processes (ranks.publish_collective)."""
        version = self.version + 1
        commit = publish_collective(
            self.pg,
            self.fault_timeout,
            self._tables,
            self._capture,
            self._raise_failure,
            version,
            lambda tables: write_delta(
                self.directory, version, self.base_dump_id, self.optim, tables
            ),
            delta_path(self.directory, version),
        )
        self.version = self._committed = version
        self.commits.append(commit)
        return version

    def wait(self) -> None:
        """Waits until every delta published in the background is committed.

        Raises:
            OSError, RuntimeError: a background write failed (see ``publish``).
        """
        self._writer.wait_below(1)
        self._raise_failure()

    def close(self) -> None:
        """Waits for the pending deltas (``wait``), then stops tracking: the tables
        record nothing any more. Raises what ``wait`` raises (after stopping)."""
        if self._closed:
            return
        try:
            self.wait()
        finally:
            self._closed = True
            self._writer.stop()
            self._capture.close()
            for t in self._tables:
                t.table.change_log = None

    def _between_deltas(self) -> None:
        """On the writer thread, between deltas: the pre-capture (single process), then
        the compaction of the logs, then the next capture's buffers made ready."""
        if self._precapturing and self.version is not None:
            self._precapture.step()
        self._compact_logs()
        if not self._precapturing:  # pre-capture reads most keys before the boundary
            self._capture.reserve()

    def _compact_logs(self) -> None:
        """Merges each log's recorded keys once it holds COMPACT_PARTS tensors, so that
        the take at the boundary sorts less."""
        for t in self._tables:
            log = t.table.change_log
            if log is not None and log.parts >= COMPACT_PARTS:
                log.compact()

    def _check_open(self, what: str) -> None:
        if self._closed:
            raise ValueError(f"DeltaPublisher.{what}: the publisher is closed")

    def _raise_failure(self) -> None:
        """Raises a background write's failure, its changes back in the logs first."""
        failure = self._writer.take_failure()
        if failure is None:
            return
        for job in (failure.job, *failure.cancelled):
            if job.tag is not None:
                restore(job.tag[1])
        self.version = self._committed  # the chain goes on after the last commit
        error = failure.error
        if failure.job.tag is None:
            raise RuntimeError(
                f"DeltaPublisher: compacting the change logs failed ({error}); no change is "
                "lost (the logs are as they were)"
            ) from error
        version = failure.job.tag[0]
        raise failed_write_error(
            error, delta_path(self.directory, version), version, len(failure.cancelled)
        ) from error


def _check_tables(tables: list) -> str | None:
    """Why this rank's tables cannot be published, or None."""
    if not tables:
        return "DeltaPublisher: the model has no dynamic embedding table"
    for t in tables:
        table = t.group.tables[t.index]
        if table.has_cache:
            return (
                f"DeltaPublisher: table {t.name!r} is in caching mode "
                f"({type(table).__name__}); deltas need tables without a cache"
            )
        if table.change_log is not None:
            return f"DeltaPublisher: table {t.name!r} is already tracked"
    return None
