"""RWLock: a released lock wakes the threads waiting for it (readers for a writer,
a writer for readers), and a writer waiting keeps new readers out."""

import threading

from dynemb.table.rw_lock import RWLock

_TIMEOUT = 10.0  # seconds a woken thread may take


def _start(target) -> tuple[threading.Thread, threading.Event]:
    done = threading.Event()

    def run() -> None:
        target()
        done.set()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, done


def test_writer_waits_for_readers_and_wakes_on_their_release():
    lock = RWLock()
    with lock.read(), lock.read():  # two readers, nested on this thread

        def write() -> None:
            with lock.write():
                pass

        thread, done = _start(write)
        assert not done.wait(0.2)  # blocked while a reader holds the lock
    assert done.wait(_TIMEOUT)  # woken by the last reader's release
    thread.join(_TIMEOUT)


def test_readers_wait_for_the_writer_and_wake_on_its_release():
    lock = RWLock()
    entered = []
    with lock.write():
        started = []
        for i in range(3):

            def read(i=i) -> None:
                with lock.read():
                    entered.append(i)

            started.append(_start(read))
        assert not any(done.wait(0.1) for _, done in started)
        assert entered == []
    assert all(done.wait(_TIMEOUT) for _, done in started)
    assert sorted(entered) == [0, 1, 2]


def test_a_waiting_writer_keeps_new_readers_out():
    lock = RWLock()
    order = []
    with lock.read():

        def write() -> None:
            with lock.write():
                order.append("write")

        writer, writer_done = _start(write)
        while not lock._writers_waiting:  # the writer is waiting
            writer_done.wait(0.01)

        def read() -> None:
            with lock.read():
                order.append("read")

        reader, reader_done = _start(read)
        assert not reader_done.wait(0.2)  # held back behind the waiting writer
    assert writer_done.wait(_TIMEOUT) and reader_done.wait(_TIMEOUT)
    assert order == ["write", "read"]


def test_an_exception_in_the_block_releases_the_lock():
    lock = RWLock()
    for guard in (lock.read, lock.write):
        try:
            with guard():
                raise KeyError("inside")
        except KeyError:
            pass
        thread, done = _start(lambda: lock.write().__enter__() or lock.write().__exit__())
        assert done.wait(_TIMEOUT)
        thread.join(_TIMEOUT)
