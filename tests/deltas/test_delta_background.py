"""Background publication (DeltaPublisher.publish(background=True)): a delta holds the
state of the batch boundary it was published at, though training changes the tables
while it is written; deltas commit in version order; a failed write is raised by the
next publish / wait / close, naming the file, and its changes go into the next delta;
close waits for the pending writes. The background chain replays to training's state.

The writer is held back by a gate (``gated``) where a test needs the write to happen
after training moved on, or several deltas to be pending at once."""

import copy
import threading

import pytest
import torch

from dynemb import (
    BatchedDynamicEmbeddingTables,
    DynamicEmbPoolingMode,
    DynamicEmbScoreStrategy,
    DynamicEmbTableOptions,
)
from dynemb.deltas import DeltaPublisher, delta_path, precapture, read_delta
from dynemb.deltas import publisher as publisher_module
from dynemb.deltas.capture import Capture
from dynemb.deltas.publisher import COMPACT_PARTS
from dynemb.inference.exportable_tables import InferenceEmbeddingCollection
from dynemb.optimizer import EmbOptimType
from dynemb.table.change_log import ChangeLog
from dynemb.table.rw_lock import RWLock

DIM = 4
SPACE = torch.arange(-100, 100)  # every key trained
NAMES = ["a", "b"]
STRATEGIES = {
    "lfu_step": (DynamicEmbScoreStrategy.LFU, DynamicEmbScoreStrategy.STEP),
    "timestamp_lfu": ((DynamicEmbScoreStrategy.TIMESTAMP, DynamicEmbScoreStrategy.LFU),) * 2,
}


def _options(strategies=STRATEGIES["lfu_step"]) -> list[DynamicEmbTableOptions]:
    out = []
    for i, strategy in enumerate(strategies):
        o = DynamicEmbTableOptions(
            dim=DIM, max_capacity=32, bucket_capacity=16, score_strategy=strategy, seed=3 + i
        )
        o.eval_initializer_args.value = 0.5 + i
        out.append(o)
    return out


def _model(options) -> BatchedDynamicEmbeddingTables:
    return BatchedDynamicEmbeddingTables(
        options, [0, 1], pooling_mode=DynamicEmbPoolingMode.NONE,
        optimizer=EmbOptimType.ADAM, learning_rate=0.1, table_names=NAMES,
    )  # fmt: skip


def _train(model, step: int, seen: list | None = None) -> None:
    """One step on 2 features x 16 keys from ~200 keys (tables of 32 rows: evictions)."""
    keys = torch.randint(-100, 100, (32,), generator=torch.Generator().manual_seed(step))
    if seen is not None:
        seen.append(keys)
    model(keys, torch.arange(keys.numel() + 1)).sum().backward()


@pytest.fixture
def gated(monkeypatch):
    """The publisher's writes wait for ``gate.set()`` (each write, on the writer thread)."""
    gate = threading.Event()
    write = publisher_module.write_delta

    def held(*args, **kwargs):
        assert gate.wait(timeout=30), "the test never opened the gate"
        return write(*args, **kwargs)

    monkeypatch.setattr(publisher_module, "write_delta", held)
    return gate


def _twin(model, publisher, directory) -> DeltaPublisher:
    """A deep copy of ``model`` now (a batch boundary) with a publisher of its own that
    stands where ``publisher`` stands (same version and base, the same keys logged)."""
    logs = [t.change_log for t in model.tables]
    # The logs are not copied (the twin's publisher attaches its own); a lock cannot
    # be: the twin gets fresh ones.
    memo = {id(log): None for log in logs}
    memo.update({id(t.lock): RWLock() for t in model.tables})
    twin = copy.deepcopy(model, memo=memo)
    twin_publisher = DeltaPublisher(twin, directory, optim=publisher.optim)
    for log, twin_table in zip(logs, twin.tables, strict=True):
        touched, removed = log.take()
        log.touched(touched)  # the original's log is left as it was
        log.removed(removed)
        twin_table.change_log.touched(touched)
        twin_table.change_log.removed(removed)
    twin_publisher.version = publisher.version
    twin_publisher.base_dump_id = publisher.base_dump_id
    return twin_publisher


def _assert_same_delta(got_path, expected_path) -> None:
    got, expected = read_delta(got_path), read_delta(expected_path)
    assert got.version == expected.version and got.base_dump_id == expected.base_dump_id
    assert got.tables.keys() == expected.tables.keys()
    for name, e in expected.tables.items():
        g = got.tables[name]
        for field in ("keys", "values", "scores", "state", "timestamps", "tombstones"):
            a, b = getattr(g, field), getattr(e, field)
            assert (a is None) == (b is None), (name, field)
            if a is not None:
                assert a.dtype == b.dtype and torch.equal(a, b), (name, field)


def _replay(options, publisher) -> InferenceEmbeddingCollection:
    serving = InferenceEmbeddingCollection(options, table_names=NAMES, feature_table_map=[0, 1])
    serving.load_from_dynamicemb_file(publisher.base_path)
    for version in range(1, publisher.version + 1):
        assert serving.apply_delta(delta_path(publisher.directory, version)) == version
    return serving


def _started(tmp_path, **kwargs) -> tuple:
    """``(options, model, publisher, seen)``: a model trained one step, its publisher
    (``kwargs``) at version 0."""
    options = _options()
    model = _model(options)
    publisher = DeltaPublisher(model, tmp_path, **kwargs)
    seen = []
    _train(model, 1, seen)
    publisher.publish_base()
    return options, model, publisher, seen


def _assert_serving_follows(model, serving, seen) -> None:
    every = torch.unique(torch.cat(seen))
    both = torch.cat([every, every])
    offsets = torch.arange(both.numel() + 1)
    model.eval()
    with torch.no_grad():
        expected = model(both, offsets)
    model.train()
    assert torch.equal(serving(both, offsets), expected)
    assert serving.sizes == [t.size() for t in model.tables]


@pytest.mark.parametrize("optim", [False, True])
@pytest.mark.parametrize("strategies", list(STRATEGIES), ids=list(STRATEGIES))
def test_a_background_delta_is_the_state_at_its_boundary(tmp_path, gated, strategies, optim):
    """Each delta is written after training went on 3 more steps (the gate), and equals
    a blocking delta published at the same boundary on a deep copy of the model."""
    model = _model(_options(STRATEGIES[strategies]))
    publisher = DeltaPublisher(model, tmp_path / "bg", optim=optim)
    _train(model, 1)
    gated.set()  # the base is not gated, but the first delta must wait for it
    publisher.publish_base()
    step = 1
    for boundary in range(2):
        for _ in range(4):
            step += 1
            _train(model, step)
        model.tables[1].erase(torch.arange(-100, 100, 7))  # tombstones
        twin = _twin(model, publisher, tmp_path / f"twin{boundary}")
        gated.clear()
        version = publisher.publish(background=True)
        before = [t.find(SPACE)[0].clone() for t in model.tables]
        for _ in range(3):  # training goes on while the delta waits to be written
            step += 1
            _train(model, step)
        after = [t.find(SPACE)[0] for t in model.tables]
        assert publisher.pending == 1 and publisher.committed_version == version - 1
        gated.set()
        publisher.wait()
        assert publisher.committed_version == version
        assert any(not torch.equal(b, a) for b, a in zip(before, after))  # it could differ
        assert twin.publish() == version
        _assert_same_delta(
            delta_path(publisher.directory, version), delta_path(twin.directory, version)
        )
        twin.close()
    delta = read_delta(delta_path(publisher.directory, 2))
    assert sum(t.tombstones.numel() for t in delta.tables.values()) > 0
    assert (delta.tables["a"].state is not None) == optim
    publisher.close()


def _assert_delta_is_the_state_now(model, path) -> None:
    """The delta at ``path`` holds each of its keys' entry in ``model`` now (row with
    optimizer state when published, score, timestamp) and tombstones of keys it lacks."""
    delta = read_delta(path)
    for name, table in zip(NAMES, model.tables, strict=True):
        d = delta.tables[name]
        rows, scores, found = table.find_entries(d.keys)
        assert bool(found.all()), name
        assert torch.equal(d.values, rows[:, :DIM]), name
        if d.state is not None:
            assert torch.equal(d.state, rows[:, DIM:]), name
        assert torch.equal(d.scores, scores), name
        if d.timestamps is not None:
            assert torch.equal(d.timestamps, table.get_timestamps(d.keys)), name
        assert not bool(table.contains(d.tombstones).any()), name
        both = torch.cat([d.keys, d.tombstones])
        assert both.unique().numel() == both.numel(), name  # one entry per key


@pytest.mark.parametrize("optim", [False, True])
@pytest.mark.parametrize("strategies", list(STRATEGIES), ids=list(STRATEGIES))
def test_a_delta_read_partly_before_its_boundary_is_the_state_at_it(
    tmp_path, monkeypatch, strategies, optim
):
    """The pre-capture (dynemb/deltas/precapture.py), driven here between steps and
    inside them (after a forward, an erase, before the backward: no seal may happen
    there), reads most of a delta before its boundary; the delta is still exactly the
    state at the boundary, and the chain replays to training's state."""
    monkeypatch.setattr(precapture, "SEAL_AT", (0.0,) * 8)  # a seal at every step()
    _train_reading_before_boundaries(tmp_path, STRATEGIES[strategies], optim)


@pytest.mark.parametrize("optim", [False, True])
def test_a_seal_requested_at_any_moment_still_gives_the_state_at_the_boundary(
    tmp_path, monkeypatch, optim
):
    """The writer thread requests a seal at any moment, for example between a lookup's
    record of its keys and that of the residents it evicted (then a generation held
    keys whose rows the backward had not written: their stale rows were published, a
    flaky failure of the test above). Here a seal is requested before every record."""
    monkeypatch.setattr(precapture, "SEAL_AT", (0.0,) * 8)
    for method in ("touched", "removed", "begin_writes"):
        recorded = getattr(ChangeLog, method)

        def requesting_first(log, *args, _recorded=recorded):
            log.request_seal()
            return _recorded(log, *args)

        monkeypatch.setattr(ChangeLog, method, requesting_first)
    _train_reading_before_boundaries(tmp_path, STRATEGIES["lfu_step"], optim)


def _train_reading_before_boundaries(tmp_path, strategies, optim) -> None:
    """Trains with a pre-capture driven between steps and inside them, publishing twice;
    each delta is the state at its boundary and the chain replays to training's."""
    options = _options(strategies)
    model = _model(options)
    publisher = DeltaPublisher(model, tmp_path, optim=optim, precapture=True)
    seen = []
    _train(model, 1, seen)
    publisher.publish_base()
    assert publisher.publish() == 1  # an interval is known from here on
    pre = publisher._precapture  # the writer thread's work, driven here
    for version in (2, 3):
        for step in range(6):
            pre.step()
            keys = torch.randint(-100, 100, (32,), generator=torch.Generator().manual_seed(step))
            seen.append(keys)
            loss = model(keys, torch.arange(keys.numel() + 1)).sum()
            pre.step()  # a seal requested now must wait for this step's backward
            model.tables[step % 2].erase(keys[:3])  # recorded while rows are unwritten
            pre.step()
            loss.backward()
        pre.step()
        assert publisher.publish() == version
        _assert_delta_is_the_state_now(model, delta_path(tmp_path, version))
        assert publisher.commits[-1].entries_before > 0  # read before the boundary
    _assert_serving_follows(model, _replay(options, publisher), seen)
    publisher.close()


def test_several_pending_deltas_commit_in_version_order_and_replay(tmp_path, gated):
    options = _options()
    model = _model(options)
    publisher = DeltaPublisher(model, tmp_path, max_pending=3)
    seen = []
    _train(model, 1, seen)
    gated.set()
    publisher.publish_base()
    gated.clear()
    for version in (1, 2, 3):
        for k in range(2):
            _train(model, 10 * version + k, seen)
        assert publisher.publish(background=True) == version
    assert publisher.pending == 3 and publisher.committed_version == 0
    assert not any(delta_path(tmp_path, v).exists() for v in (1, 2, 3))
    gated.set()
    publisher.wait()
    assert [c.version for c in publisher.commits] == [1, 2, 3]
    assert all(c.bytes > 0 and c.write_seconds > 0 for c in publisher.commits)
    for k in range(3):  # a blocking delta after background ones follows them
        _train(model, 40 + k, seen)
    assert publisher.publish() == 4
    _assert_serving_follows(model, _replay(options, publisher), seen)
    publisher.close()


def test_a_capture_reuses_a_written_deltas_buffers_never_a_pending_ones(tmp_path, monkeypatch):
    """A capture gathers into the buffers of a delta already written (no fresh memory
    to fault in), never into those of a delta still pending; the chain replays."""
    gate, buffers = threading.Event(), {}  # version -> {table: address of its values}
    write = publisher_module.write_delta

    def spy(directory, version, base_dump_id, optim, tables):
        buffers[version] = {n: d.values.data_ptr() for n, (_, d) in tables.items()}
        if version >= 2:
            assert gate.wait(timeout=30), "the test never opened the gate"
        return write(directory, version, base_dump_id, optim, tables)

    monkeypatch.setattr(publisher_module, "write_delta", spy)
    options = _options()
    model = _model(options)
    publisher = DeltaPublisher(model, tmp_path, max_pending=2)
    seen = []
    publisher.publish_base()
    for step in range(3):  # delta 1 holds more rows than those after it
        _train(model, step, seen)
    assert publisher.publish() == 1  # written: its buffers are free again
    _train(model, 10, seen)
    assert publisher.publish(background=True) == 2  # delta 1's buffers, until written
    _train(model, 11, seen)
    assert publisher.publish(background=True) == 3  # delta 2 pends: buffers of its own
    assert publisher.pending == 2
    gate.set()
    publisher.wait()
    assert buffers[2] == buffers[1]
    assert all(buffers[3][name] != buffers[2][name] for name in NAMES)
    _train(model, 12, seen)
    assert publisher.publish() == 4
    assert all(buffers[4][n] in (buffers[2][n], buffers[3][n]) for n in NAMES)
    _assert_serving_follows(model, _replay(options, publisher), seen)
    publisher.close()


def test_a_publish_beyond_max_pending_waits_for_the_oldest(tmp_path, gated):
    model = _model(_options())
    publisher = DeltaPublisher(model, tmp_path, max_pending=1)
    _train(model, 1)
    gated.set()
    publisher.publish_base()
    gated.clear()
    publisher.publish(background=True)
    _train(model, 2)
    opener = threading.Timer(0.2, gated.set)
    opener.start()
    assert publisher.publish(background=True) == 2  # returns once delta 1 is written
    assert publisher.committed_version >= 1 and delta_path(tmp_path, 1).exists()
    publisher.close()
    assert publisher.committed_version == 2
    opener.join()


def test_a_failed_background_write_is_raised_and_its_changes_go_into_the_next(tmp_path, gated):
    """Delta 2 cannot be written (its directory name is taken by a file); 3 was pending
    behind it. wait() raises naming the file; the next delta is 2 and holds both."""
    options = _options()
    model = _model(options)
    publisher = DeltaPublisher(model, tmp_path, max_pending=3)
    seen = []
    _train(model, 1, seen)
    gated.set()
    publisher.publish_base()
    gated.clear()
    obstacle = delta_path(tmp_path, 2)
    obstacle.write_text("in the way")
    for version in (1, 2, 3):
        _train(model, 10 + version, seen)
        model.tables[0].erase(seen[-1][:4])
        assert publisher.publish(background=True) == version
    gated.set()
    with pytest.raises(FileExistsError, match=f"background write of {obstacle} failed"):
        publisher.wait()
    assert publisher.version == publisher.committed_version == 1
    assert not delta_path(tmp_path, 3).exists()
    publisher.wait()  # raised once
    obstacle.unlink()
    _train(model, 20, seen)
    assert publisher.publish(background=True) == 2
    publisher.close()
    assert publisher.committed_version == 2
    _assert_serving_follows(model, _replay(options, publisher), seen)


def test_close_waits_and_raises_a_failed_write(tmp_path, monkeypatch):
    model = _model(_options())
    publisher = DeltaPublisher(model, tmp_path)
    _train(model, 1)
    publisher.publish_base()
    gate = threading.Event()
    write = publisher_module.write_delta

    def failing(directory, version, *args):
        assert gate.wait(timeout=30)
        if version == 2:
            raise RuntimeError("injected")
        return write(directory, version, *args)

    monkeypatch.setattr(publisher_module, "write_delta", failing)
    _train(model, 2)
    publisher.publish(background=True)
    _train(model, 3)
    publisher.publish(background=True)
    threading.Timer(0.2, gate.set).start()
    with pytest.raises(RuntimeError, match=r"delta-00000002 failed \(injected\)"):
        publisher.close()
    assert delta_path(tmp_path, 1).exists() and not delta_path(tmp_path, 2).exists()
    assert all(t.change_log is None for t in model.tables)  # closed all the same
    with pytest.raises(ValueError, match="closed"):
        publisher.publish(background=True)


def test_close_waits_for_the_pending_writes(tmp_path, gated):
    model = _model(_options())
    publisher = DeltaPublisher(model, tmp_path)
    _train(model, 1)
    gated.set()
    publisher.publish_base()
    gated.clear()
    _train(model, 2)
    publisher.publish(background=True)
    threading.Timer(0.2, gated.set).start()
    publisher.close()
    assert publisher.pending == 0 and publisher.committed_version == 1
    assert read_delta(delta_path(tmp_path, 1)).version == 1


@pytest.mark.parametrize("bad", [0, -1, True, 1.5, "2"])
def test_max_pending_is_checked(tmp_path, bad):
    model = _model(_options())
    with pytest.raises(ValueError, match=f"max_pending must be an integer >= 1, got {bad!r}"):
        DeltaPublisher(model, tmp_path, max_pending=bad)
    assert all(t.change_log is None for t in model.tables)  # nothing attached


def test_a_failed_compaction_is_raised_and_loses_nothing(tmp_path, monkeypatch):
    """The writer thread compacts the change logs between deltas; an error there is
    raised by the next publish, and the logs are as they were."""
    options, model, publisher, seen = _started(tmp_path)
    compacted = threading.Event()

    def failing(log):
        compacted.set()
        raise MemoryError("injected")

    monkeypatch.setattr(ChangeLog, "compact", failing)
    for step in range(2, 2 + COMPACT_PARTS):  # a tensor per step at least: compacted
        _train(model, step, seen)
    assert compacted.wait(timeout=10)
    with pytest.raises(RuntimeError, match=r"compacting the change logs failed \(injected\)"):
        publisher.wait()
    monkeypatch.undo()
    assert publisher.publish(background=True) == 1
    publisher.close()
    _assert_serving_follows(model, _replay(options, publisher), seen)


@pytest.mark.parametrize("on", [True, False])
def test_precapture_off_reads_every_key_at_the_boundary(tmp_path, monkeypatch, on):
    monkeypatch.setattr(precapture, "SEAL_AT", (0.0,) * 8)  # a seal at every tick
    options, model, publisher, seen = _started(tmp_path, precapture=on)
    for version in (1, 2, 3):
        for step in range(3):
            _train(model, 10 * version + step, seen)
            publisher._between_deltas()  # the writer thread's tick, now
        assert publisher.publish() == version
        _assert_delta_is_the_state_now(model, delta_path(tmp_path, version))
    assert (publisher.commits[-1].entries_before > 0) == on  # none before the first
    _assert_serving_follows(model, _replay(options, publisher), seen)
    publisher.close()


def test_a_failed_capture_loses_no_change(tmp_path, monkeypatch):
    """The tables are read in parallel at a boundary; one that fails raises, and every
    table's keys (read or not) go into the next delta."""
    options, model, publisher, seen = _started(tmp_path)
    for step in range(3):
        _train(model, 10 + step, seen)
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
    _train(model, 20, seen)
    assert publisher.publish() == 1
    _assert_delta_is_the_state_now(model, delta_path(tmp_path, 1))
    _assert_serving_follows(model, _replay(options, publisher), seen)
    publisher.close()


@pytest.mark.parametrize("bad", [1, None, "yes"])
def test_precapture_is_checked(tmp_path, bad):
    with pytest.raises(TypeError, match=f"precapture must be a bool, got {bad!r}"):
        DeltaPublisher(_model(_options()), tmp_path, precapture=bad)


def test_background_must_be_a_bool(tmp_path):
    model = _model(_options())
    publisher = DeltaPublisher(model, tmp_path)
    publisher.publish_base()
    with pytest.raises(TypeError, match="background must be a bool, got 1"):
        publisher.publish(background=1)
    assert publisher.version == 0 and publisher.pending == 0
    publisher.close()
