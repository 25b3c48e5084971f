"""Dumps to one path at once (threads, processes) never destroy the checkpoint: they run
one after the other, and after each round the path loads the last committed dump
bit-exact, with no other dump directory left."""

import os
import threading
import time

import pytest
import torch

from dynemb.checkpoint import DynamicEmbDump, DynamicEmbLoad
from dynemb.checkpoint import writer as dump_module
from dynemb.checkpoint.writer import committed_dump
from tests.support.checkpoint_tables import contents, make_module, same, train

pytestmark = pytest.mark.no_emulated_pass("dump locking between threads and processes: Python only")

ROUNDS = 20
WRITERS = 3


@pytest.fixture(scope="module")
def modules():
    """WRITERS modules with different contents, each big enough that dumps overlap."""
    out = []
    for i in range(WRITERS):
        m = make_module(dim=16, capacity=1 << 15)
        train(m, torch.arange(i * 7_000, i * 7_000 + 16_000))
        out.append((m, contents(m)))
    return out


def _check_committed(path, want) -> None:
    loaded = make_module(dim=16, capacity=1 << 15)
    DynamicEmbLoad(path, loaded, optim=True)
    assert same(contents(loaded), want), "the path does not hold the last committed dump"
    dirs = sorted(p.name for p in path.iterdir() if p.is_dir())
    assert dirs == [committed_dump(path)], f"dump directories left: {dirs}"


def _record_commits(monkeypatch, log: list, lock: threading.Lock) -> None:
    real = dump_module.write_manifest

    def write_manifest(path, manifest):
        real(path, manifest)
        with lock:
            log.append((manifest["dump_id"], threading.current_thread().name))

    monkeypatch.setattr(dump_module, "write_manifest", write_manifest)


def _dump_at_once(path, modules, allow_overwrite: bool) -> tuple[list, list]:
    """Every module dumped to ``path`` by its own thread (named by its index), at once;
    returns ``(indices that succeeded, errors)``."""
    won, errors = [], []

    def dump(i: int) -> None:
        try:
            DynamicEmbDump(path, modules[i][0], optim=True, allow_overwrite=allow_overwrite)
            won.append(i)
        except Exception as e:  # collected and asserted by the caller
            errors.append(e)

    threads = [threading.Thread(target=dump, args=(i,), name=str(i)) for i in range(WRITERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return won, errors


def test_threads_dumping_to_one_path(tmp_path, modules, monkeypatch):
    path = tmp_path / "ckpt"
    log, lock = [], threading.Lock()
    _record_commits(monkeypatch, log, lock)
    for _ in range(ROUNDS):
        _, errors = _dump_at_once(path, modules, allow_overwrite=True)
        assert not errors, errors
        last_id, last_writer = log[-1]
        assert committed_dump(path) == last_id
        _check_committed(path, modules[int(last_writer)][1])


def test_without_allow_overwrite_exactly_one_of_concurrent_first_dumps_wins(tmp_path, modules):
    for round_ in range(5):
        path = tmp_path / f"ckpt{round_}"
        won, errors = _dump_at_once(path, modules, allow_overwrite=False)
        assert len(won) == 1 and len(errors) == WRITERS - 1, (won, errors)
        assert all(isinstance(e, FileExistsError) for e in errors), errors
        assert "allow_overwrite=True" in str(errors[0])
        _check_committed(path, modules[won[0]][1])


def test_processes_dumping_to_one_path(tmp_path, modules):
    path = tmp_path / "ckpt"
    times = tmp_path / "commit-times"
    times.mkdir()

    def dump_in_child(i: int, round_: int) -> int:
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                torch.set_num_threads(1)
                real = dump_module.write_manifest

                def write_manifest(p, manifest):
                    real(p, manifest)  # under the dump lock: commit times are ordered
                    (times / f"{round_}.{i}").write_text(str(time.monotonic_ns()))

                dump_module.write_manifest = write_manifest
                DynamicEmbDump(path, modules[i][0], optim=True, allow_overwrite=True)
                code = 0
            finally:
                os._exit(code)
        return pid

    for round_ in range(ROUNDS):
        pids = [dump_in_child(i, round_) for i in range(2)]
        codes = [os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in pids]
        assert codes == [0, 0], f"round {round_}: a dump failed ({codes})"
        stamps = {i: int((times / f"{round_}.{i}").read_text()) for i in range(2)}
        last = max(stamps, key=stamps.get)
        _check_committed(path, modules[last][1])


def test_loads_while_dumps_replace_the_checkpoint(tmp_path, modules):
    """A load racing a dump's commit (which removes the superseded dump directory)
    holds a shared lock: every load succeeds with one committed dump, never a mix."""
    path = tmp_path / "ckpt"
    DynamicEmbDump(path, modules[0][0], optim=True)
    stop, errors, loaded = threading.Event(), [], []

    def dump() -> None:
        try:
            for k in range(ROUNDS // 2):
                DynamicEmbDump(path, modules[k % WRITERS][0], optim=True, allow_overwrite=True)
        except Exception as e:  # asserted below
            errors.append(e)
        finally:
            stop.set()

    def load() -> None:
        while not stop.is_set():
            module = make_module(dim=16, capacity=1 << 15)
            try:
                DynamicEmbLoad(path, module, optim=True)
            except Exception as e:  # asserted below
                errors.append(e)
                return
            loaded.append(contents(module))

    threads = [threading.Thread(target=dump), threading.Thread(target=load)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert loaded, "no load ran while the dumps did"
    for got in loaded:
        assert any(same(got, want) for _, want in modules), "a load mixed two dumps"
