"""Agreement among the ranks of a collective operation (checkpoint dump and load,
incremental dump, collective planning), with a bounded wait on a dead rank.

A multi-rank dump has steps every rank must pass together (the dump directory is
made, every rank wrote its files, rank 0 committed). A collective (gloo) at such a
step cannot tell a slow rank from a dead one: a rank killed mid-dump gives its
neighbours "Connection reset by peer", naming nothing, and the other ranks a wait of
the whole process-group timeout (30 minutes by default); a rank that caught its
error and went on leaves the others waiting just as long.

So these steps go through the process group's key-value store (the c10d store every
``init_process_group`` creates) instead, under a prefix unique to the operation:

    <prefix>/beat/<rank>     a counter each rank's heartbeat thread increments
                             every ``timeout / 8`` seconds (at most every second)
    <prefix>/<step>/<rank>   what the rank posts at a step: JSON, with its error if any

A rank waiting at a step polls for the others' posts. A post that carries an error
ends the wait at once on every rank, which raises RankFailure naming the failed rank
and its error. A rank whose heartbeat stopped advancing for ``timeout`` seconds is
dead (killed, out of memory, its interpreter frozen): every other rank raises
RankFailure naming it, ``timeout`` seconds after its last beat at the latest. A rank
that is alive but stuck with its GIL free keeps beating; the process group's own
timeout is the bound there. If the store itself is gone (its host, global rank 0,
died) every store call fails at once, and the error says so.

A rank whose operation raises (and that stays alive) posts its error under
``<prefix>/failed`` on its way out of the agreement; a rank waiting at any step reads
it and raises RankFailure at once. Collectives (gloo) run through ``collective``:
every rank first posts that it arrived, so none enters a collective that a failed
rank will never join; a rank that dies inside one gives its peers a transport error,
which ``collective`` turns into RankFailure naming the dead rank once its heartbeat
has stopped (within ``timeout``).

The prefix counts the operations of each kind on each group, so every rank of a
group must run the same checkpoint operations in the same order, which the
collectives of a checkpoint require anyway.
"""

import contextlib
import contextvars
import itertools
import json
import threading
import time
from collections import defaultdict

import torch.distributed as dist

DEFAULT_TIMEOUT_S = 60.0
# A wait polls the store after 0.5 ms, then ever less often, up to every 20 ms: one
# store call costs ~20 us, and most steps complete within a millisecond or two.
_FIRST_POLL_S, _POLL_S = 0.0005, 0.02
_sequences: defaultdict = defaultdict(itertools.count)
_active: contextvars.ContextVar = contextvars.ContextVar("dynemb_rank_agreement", default=None)


class RankFailure(RuntimeError):
    """Another rank of the group failed or died during a checkpoint operation.

    Attributes:
        rank: the failed rank (in the operation's group).
        error: its error, as that rank reported it ("" for a rank that died).
    """

    def __init__(self, message: str, rank: int, error: str = "") -> None:
        super().__init__(message)
        self.rank = rank
        self.error = error


def _default_store():
    """The c10d store ``init_process_group`` created (torch offers no public getter)."""
    return dist.distributed_c10d._get_default_store()  # noqa: SLF001 - see the docstring


class RankAgreement:
    """The steps of one checkpoint operation over ``pg`` (a context manager that runs
    this rank's heartbeat). With ``pg`` None (one process) every step returns at once.

    Args:
        pg: the operation's process group, or None.
        op: the operation's name, for the messages (``"DynamicEmbDump"``).
        timeout: seconds without a heartbeat after which a rank counts as dead (> 0).

    Example::

        with RankAgreement(pg, "DynamicEmbDump", 60.0) as ranks:
            dump_id = ranks.post("start", dump_id, root=0)[0]
            ...
            statuses = ranks.post("written", {"error": error})
    """

    def __init__(self, pg, op: str, timeout: float) -> None:
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not timeout > 0:
            raise ValueError(
                f"{op}: `fault_timeout` must be a positive number of seconds, got {timeout!r}"
            )
        self.op, self.timeout = op, float(timeout)
        self.rank, self.world_size = (
            (dist.get_rank(pg), dist.get_world_size(pg)) if pg is not None else (0, 1)
        )
        self._store = None
        self._arrivals = itertools.count()  # the collectives of this operation so far
        if pg is not None and self.world_size > 1:
            sequence = next(_sequences[(op, pg.group_name)])
            prefix = f"dynemb/{op}/{pg.group_name}/{sequence}/"
            self._store = dist.PrefixStore(prefix, _default_store())
        self._dead = None  # the rank this one found dead
        self._stop = threading.Event()
        self._beat = threading.Thread(target=self._beat_loop, daemon=True)

    def __enter__(self) -> "RankAgreement":
        if self._store is not None:
            self._call(self._store.add, f"beat/{self.rank}", 1)
            self._beat.start()
        self._token = _active.set(self)
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        _active.reset(self._token)
        if self._store is not None and exc is not None and not isinstance(exc, RankFailure):
            with contextlib.suppress(Exception):  # tell the others, who may be waiting
                failure = {"rank": self.rank, "error": f"{type(exc).__name__}: {exc}"}
                self._store.set("failed", json.dumps(failure))
        self._stop.set()
        if self._beat.is_alive():
            self._beat.join()
        if self._store is None:
            return
        # The store lives in global rank 0: it leaves last, or a rank still waiting
        # would see "store unreachable" instead of the failure it is about to learn.
        with contextlib.suppress(Exception):
            self._store.add("left", 1)
            if self.rank == 0:
                deadline = time.monotonic() + self.timeout
                alive = self.world_size - (self._dead is not None)
                while self._store.add("left", 0) < alive and time.monotonic() < deadline:
                    time.sleep(_POLL_S)

    def _beat_loop(self) -> None:
        interval = min(1.0, self.timeout / 8)
        while not self._stop.wait(interval):
            try:
                self._store.add(f"beat/{self.rank}", 1)
            except Exception:  # the store is gone: the waits report it
                return

    def _call(self, fn, *args):
        try:
            return fn(*args)
        except Exception as e:  # the store's errors have no common type
            raise RankFailure(
                f"{self.op}: the process group's store is unreachable ({e}); its host "
                "(global rank 0) probably died",
                0,
                str(e),
            ) from e

    def collective(self, fn, *args):
        """Runs the collective ``fn(*args)`` once every rank has arrived here.

        Raises:
            RankFailure: a rank failed or died before arriving, or died inside the
                collective (its peers' transport error becomes one naming it).
        """
        if self._store is None:
            return fn(*args)
        self.post(f"arrived/{next(self._arrivals)}", None)
        try:
            return fn(*args)
        except Exception:
            # Who went away? Wait for a failure post or a heartbeat that stops (a dead
            # rank's stops `timeout` after its last beat, which this wait must outlast);
            # with neither, the error is not a rank fault: raise it as is.
            others = [r for r in range(self.world_size) if r != self.rank]
            deadline = time.monotonic() + 1.5 * self.timeout + 1
            self._wait("never", others, wait_all=False, deadline=deadline)
            raise

    def announce(self, step: str, value) -> None:
        """Posts ``value`` at ``step`` without waiting for the others (a rank that
        failed tells the others, then raises its own error)."""
        if self._store is not None:
            self._call(self._store.set, f"{step}/{self.rank}", json.dumps(value))

    def post(self, step: str, value, root: int | None = None, wait_all: bool = False) -> list:
        """Posts ``value`` (JSON-able) at ``step`` and returns every rank's, in rank order.

        With ``root`` set, only that rank's value counts: it posts, the others post
        nothing and wait for it; the result is ``[root's value]``. A value
        ``{"error": <text>}`` reports a failure.

        Args:
            wait_all: wait for every rank's post even after one reported a failure
                (the rank that cleans up must know that nobody still writes), then
                raise for it.

        Raises:
            RankFailure: a rank (not this one) posted ``{"error": ...}``, or a rank
                the step waits for stopped beating for ``timeout`` seconds.
        """
        if self._store is None:
            return [value]
        if root is None or root == self.rank:
            self._call(self._store.set, f"{step}/{self.rank}", json.dumps(value))
        ranks = [root] if root is not None else list(range(self.world_size))
        got = self._wait(step, ranks, wait_all)
        for r in sorted(got):
            v = got[r]
            if r != self.rank and isinstance(v, dict) and v.get("error"):
                raise RankFailure(
                    f"{self.op}: rank {r} of {self.world_size} failed: {v['error']}", r, v["error"]
                )
        return [got[r] for r in ranks]

    def _stopped(self, r: int, step: str) -> RankFailure:
        return RankFailure(
            f"{self.op}: rank {r} of {self.world_size} stopped responding (no heartbeat "
            f"for {self.timeout:g} s at step {step!r}): it died or was killed",
            r,
        )

    def _posted(self, step: str, r: int, ranks: list[int], got: dict) -> bool:
        """Whether rank ``r``, found failed, had posted at ``step`` (one this step waits
        for; read into ``got``): a rank posts its outcome, then raises and announces its
        failure, and a waiter that missed the post by a poll must still take it (rank 0
        of a delta publication posts its write error so, for the others to raise)."""
        if r in got:
            return True
        if r not in ranks or not self._call(self._store.check, [f"{step}/{r}"]):
            return False
        got[r] = json.loads(self._call(self._store.get, f"{step}/{r}"))
        return True

    def _wait(self, step: str, ranks: list[int], wait_all: bool, deadline=None) -> dict:
        got: dict = {}
        seen = {}  # rank -> (its beat count, when this rank saw it change)
        poll = _FIRST_POLL_S
        while deadline is None or time.monotonic() < deadline:
            for r in ranks:
                key = f"{step}/{r}"
                if r not in got and self._call(self._store.check, [key]):
                    got[r] = json.loads(self._call(self._store.get, key))
                    failed = isinstance(got[r], dict) and got[r].get("error")
                    if failed and r != self.rank and not wait_all:
                        return got  # a failure ends the wait at once
            if len(got) == len(ranks):
                return got
            # wait_all: the rank that cleans up waits for every post at this step;
            # a failed rank posts its error there before it leaves.
            if not wait_all and self._call(self._store.check, ["failed"]):
                failed = json.loads(self._call(self._store.get, "failed"))
                who = failed["rank"]
                if who != self.rank:
                    if not self._posted(step, who, ranks, got):
                        raise RankFailure(
                            f"{self.op}: rank {who} of {self.world_size} failed: {failed['error']}",
                            who,
                            failed["error"],
                        )
                    if isinstance(got[who], dict) and got[who].get("error"):
                        return got  # its post reports the failure, as above
            if self._call(self._store.check, ["dead"]):  # another rank found one dead
                self._dead = int(self._call(self._store.get, "dead"))
                raise self._stopped(self._dead, step)
            now = time.monotonic()
            for r in ranks:
                if r in got:
                    continue
                beat = self._call(self._store.add, f"beat/{r}", 0)
                if r not in seen or seen[r][0] != beat:
                    seen[r] = (beat, now)
                elif now - seen[r][1] > self.timeout:
                    self._dead = r
                    self._call(self._store.set, "dead", str(r))  # tells every other rank
                    raise self._stopped(r, step)
            time.sleep(poll)
            poll = min(2 * poll, _POLL_S)
        return got


def collective(fn, *args):
    """``fn(*args)``, a collective, through the RankAgreement of the checkpoint
    operation in progress (see RankAgreement.collective), or directly outside one."""
    ranks = _active.get()
    return fn(*args) if ranks is None else ranks.collective(fn, *args)


__all__ = ["DEFAULT_TIMEOUT_S", "RankAgreement", "RankFailure", "collective"]
