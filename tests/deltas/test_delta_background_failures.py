"""Background publication when something fails or waits: a failed write is raised by
the next publish / wait / close, naming the file, and its changes go into the next
delta; a failed capture or compaction loses nothing; close waits for the pending
writes; the publisher's arguments are checked."""

import threading

import pytest

from dynemb.deltas import DeltaPublisher, delta_path, precapture, read_delta
from dynemb.deltas import publisher as publisher_module
from dynemb.deltas.capture import Capture
from dynemb.deltas.publisher import COMPACT_PARTS
from dynemb.table.change_log import ChangeLog
from tests.support.background_models import (
    assert_delta_is_the_state_now,
    assert_serving_follows,
    model_of,
    replay,
    started,
    table_options,
    train_step,
)


def test_a_failed_background_write_is_raised_and_its_changes_go_into_the_next(tmp_path, gated):
    """Delta 2 cannot be written (its directory name is taken by a file); 3 was pending
    behind it. wait() raises naming the file; the next delta is 2 and holds both."""
    options, model, publisher, seen = started(tmp_path, gated, max_pending=3)
    obstacle = delta_path(tmp_path, 2)
    obstacle.write_text("in the way")
    for version in (1, 2, 3):
        train_step(model, 10 + version, seen)
        model.tables[0].erase(seen[-1][:4])
        assert publisher.publish(background=True) == version
    gated.set()
    with pytest.raises(FileExistsError, match=f"background write of {obstacle} failed"):
        publisher.wait()
    assert publisher.version == publisher.committed_version == 1
    assert not delta_path(tmp_path, 3).exists()
    publisher.wait()  # raised once
    obstacle.unlink()
    train_step(model, 20, seen)
    assert publisher.publish(background=True) == 2
    publisher.close()
    assert publisher.committed_version == 2
    assert_serving_follows(model, replay(options, publisher), seen)


def test_close_waits_and_raises_a_failed_write(tmp_path, monkeypatch):
    model = model_of(table_options())
    publisher = DeltaPublisher(model, tmp_path)
    train_step(model, 1)
    publisher.publish_base()
    gate = threading.Event()
    write = publisher_module.write_delta

    def failing(directory, version, *args):
        assert gate.wait(timeout=30)
        if version == 2:
            raise RuntimeError("injected")
        return write(directory, version, *args)

    monkeypatch.setattr(publisher_module, "write_delta", failing)
    train_step(model, 2)
    publisher.publish(background=True)
    train_step(model, 3)
    publisher.publish(background=True)
    threading.Timer(0.2, gate.set).start()
    with pytest.raises(RuntimeError, match=r"delta-00000002 failed \(injected\)"):
        publisher.close()
    assert delta_path(tmp_path, 1).exists() and not delta_path(tmp_path, 2).exists()
    assert all(t.change_log is None for t in model.tables)  # closed all the same
    with pytest.raises(ValueError, match="closed"):
        publisher.publish(background=True)


def test_close_waits_for_the_pending_writes(tmp_path, gated):
    model = model_of(table_options())
    publisher = DeltaPublisher(model, tmp_path)
    train_step(model, 1)
    gated.set()
    publisher.publish_base()
    gated.clear()
    train_step(model, 2)
    publisher.publish(background=True)
    threading.Timer(0.2, gated.set).start()
    publisher.close()
    assert publisher.pending == 0 and publisher.committed_version == 1
    assert read_delta(delta_path(tmp_path, 1)).version == 1


@pytest.mark.parametrize("bad", [0, -1, True, 1.5, "2"])
def test_max_pending_is_checked(tmp_path, bad):
    model = model_of(table_options())
    with pytest.raises(ValueError, match=f"max_pending must be an integer >= 1, got {bad!r}"):
        DeltaPublisher(model, tmp_path, max_pending=bad)
    assert all(t.change_log is None for t in model.tables)  # nothing attached


def test_a_failed_compaction_is_raised_and_loses_nothing(tmp_path, monkeypatch):
    """The writer thread compacts the change logs between deltas; an error there is
    raised by the next publish, and the logs are as they were."""
    options, model, publisher, seen = started(tmp_path)
    compacted = threading.Event()

    def failing(log):
        compacted.set()
        raise MemoryError("injected")

    monkeypatch.setattr(ChangeLog, "compact", failing)
    for step in range(2, 2 + COMPACT_PARTS):  # a tensor per step at least: compacted
        train_step(model, step, seen)
    assert compacted.wait(timeout=10)
    with pytest.raises(RuntimeError, match=r"compacting the change logs failed \(injected\)"):
        publisher.wait()
    monkeypatch.undo()
    assert publisher.publish(background=True) == 1
    publisher.close()
    assert_serving_follows(model, replay(options, publisher), seen)


@pytest.mark.parametrize("on", [True, False])
def test_precapture_off_reads_every_key_at_the_boundary(tmp_path, monkeypatch, on):
    monkeypatch.setattr(precapture, "SEAL_AT", (0.0,) * 8)  # a seal at every tick
    options, model, publisher, seen = started(tmp_path, precapture=on)
    for version in (1, 2, 3):
        for step in range(3):
            train_step(model, 10 * version + step, seen)
            publisher._between_deltas()  # the writer thread's tick, now
        assert publisher.publish() == version
        assert_delta_is_the_state_now(model, delta_path(tmp_path, version))
    assert (publisher.commits[-1].entries_before > 0) == on  # none before the first
    assert_serving_follows(model, replay(options, publisher), seen)
    publisher.close()


def test_a_failed_capture_loses_no_change(tmp_path, monkeypatch):
    """The tables are read in parallel at a boundary; one that fails raises, and every
    table's keys (read or not) go into the next delta."""
    options, model, publisher, seen = started(tmp_path)
    for step in range(3):
        train_step(model, 10 + step, seen)
    read = Capture.table

    def fail_b(self, t, touched, removed):
        if t.name == "b":
            raise RuntimeError("capture of b failed")
        return read(self, t, touched, removed)

    monkeypatch.setattr(Capture, "table", fail_b)
    with pytest.raises(RuntimeError, match="capture of b failed"):
        publisher.publish()
    monkeypatch.setattr(Capture, "table", read)
    assert publisher.version == 0
    train_step(model, 20, seen)
    assert publisher.publish() == 1
    assert_delta_is_the_state_now(model, delta_path(tmp_path, 1))
    assert_serving_follows(model, replay(options, publisher), seen)
    publisher.close()


@pytest.mark.parametrize("bad", [1, None, "yes"])
def test_precapture_is_checked(tmp_path, bad):
    with pytest.raises(TypeError, match=f"precapture must be a bool, got {bad!r}"):
        DeltaPublisher(model_of(table_options()), tmp_path, precapture=bad)


def test_background_must_be_a_bool(tmp_path):
    model = model_of(table_options())
    publisher = DeltaPublisher(model, tmp_path)
    publisher.publish_base()
    with pytest.raises(TypeError, match="background must be a bool, got 1"):
        publisher.publish(background=1)
    assert publisher.version == 0 and publisher.pending == 0
    publisher.close()
