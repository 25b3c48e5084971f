"""A table's ops on several streams run in the order its guard let them in.

On the emulated executor's stream model (dynemb.emulated_streams: each stream a
queue, the queues interleaved by the seed, events the only order between them), a
sequence of table ops spread over three streams gives the results of the same
sequence run at once, op after op; with the tables' waits dropped, some seed gives
other results, so a missing event fails this test. The CPU pass checks that the host
has no streams (nothing to order, nothing recorded).
"""

import contextlib

import pytest
import torch

from dynemb import _ops, streams
from dynemb.emulated_streams import StreamModel, emulated_streams
from dynemb.table.scored_hash_table import ScoredHashTable

EMULATED = _ops.executor() == "cuda-emulated"
emulated_only = pytest.mark.skipif(not EMULATED, reason="streams exist on the emulated executor")
SEEDS = range(8)


def _table() -> ScoredHashTable:
    # At its capacity (no growth, so no read of the status counts) and evicting.
    return ScoredHashTable(dim=4, capacity=64, bucket_capacity=16)


def _script(seed: int) -> list[tuple]:
    """Ops on one table: (stream index, op, keys, value)."""
    g = torch.Generator().manual_seed(1000 + seed)
    ops = []
    for i in range(24):
        keys = torch.randint(0, 48, (6,), generator=g).unique()
        op = ("find", "assign", "erase", "find_or_insert")[i % 4]
        ops.append((int(torch.randint(0, 3, (1,), generator=g)), op, keys, float(i + 1)))
    return ops


def _run(table: ScoredHashTable, script: list, model=None) -> list[torch.Tensor]:
    """Runs ``script``; with ``model``, each op on its stream. Returns every op's
    result (read after the model ran every queue)."""
    side = [None] if model is None else [model.default, model.new_stream(), model.new_stream()]
    results = []
    for s, op, keys, value in script:
        with model.use(side[s]) if model is not None else contextlib.nullcontext():
            if op == "find":
                results += table.find(keys)
            elif op == "assign":
                table.insert_or_assign(keys, torch.full((keys.numel(), 4), value))
            elif op == "erase":
                results.append(table.erase_keys(keys))
            else:
                results.append(table.find_or_insert(keys))
    return results


def _contents(table: ScoredHashTable) -> torch.Tensor:
    values, found = table.find(torch.arange(48))
    return torch.where(found[:, None], values, -1.0)


def _reference(seed: int) -> tuple[list, torch.Tensor]:
    table = _table()
    results = _run(table, _script(seed))
    return results, _contents(table)


def _with_streams(seed: int) -> tuple[list, torch.Tensor, int]:
    table = _table()
    with emulated_streams(seed) as model:
        results = _run(table, _script(seed), model)
        queued = model.queued_ops
    return results, _contents(table), queued


def _same(a: list, b: list) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


@emulated_only
@pytest.mark.parametrize("seed", SEEDS)
def test_ops_on_three_streams_give_the_results_of_one(seed):
    expected, contents = _reference(seed)
    results, got, queued = _with_streams(seed)
    assert queued > 0  # the ops were queued, not run at once
    assert _same(results, expected)
    assert torch.equal(got, contents)


@emulated_only
def test_a_missing_event_fails(monkeypatch):
    # The tables' ordering calls the model's `wait`; dropping it leaves the queues
    # unordered, and the seed's interleaving then runs some op out of turn.
    monkeypatch.setattr(StreamModel, "wait", lambda self, stream, event: None)
    wrong = 0
    for seed in SEEDS:
        expected, contents = _reference(seed)
        results, got, _ = _with_streams(seed)
        wrong += not (_same(results, expected) and torch.equal(got, contents))
    assert wrong > 0, "without events every interleaving gave the single-stream results"


@emulated_only
def test_reader_then_writer_on_another_stream(monkeypatch):
    # A host read of the writer's stream runs that stream's queue: without the event,
    # the write runs before the reader's queued find, whatever the seed.
    def run() -> torch.Tensor:
        table = _table()
        keys = torch.arange(8)
        table.insert_or_assign(keys, torch.ones(8, 4))
        with emulated_streams() as model:
            with model.use(model.new_stream("reader")):
                values, _ = table.find(keys)
            table.insert_or_assign(keys, torch.full((8, 4), 2.0))
            streams.host_read(keys)
        return values

    assert torch.equal(run(), torch.ones(8, 4))
    monkeypatch.setattr(StreamModel, "wait", lambda self, stream, event: None)
    assert torch.equal(run(), torch.full((8, 4), 2.0))


@emulated_only
def test_one_stream_records_no_event(monkeypatch):
    recorded = []
    original = StreamModel.event_after
    monkeypatch.setattr(
        StreamModel, "event_after", lambda self, s: recorded.append(s) or original(self, s)
    )
    table = _table()
    with emulated_streams() as model:
        with model.use(model.new_stream("side")):
            _run(table, [(0, op, k, v) for _, op, k, v in _script(0)])
    assert len(recorded) == 0


@emulated_only
def test_a_host_read_waits_for_its_stream_only():
    with emulated_streams() as model:
        side = model.new_stream("side")
        x = torch.zeros(4)
        x.add_(1)  # queued on the default stream
        with model.use(side):
            y = torch.ones(4) * 3
            assert y.sum().item() == 12  # runs the side queue alone
        assert len(model.default.queue) == 2  # zeros and add_ are still queued
    assert torch.equal(x, torch.ones(4))


@emulated_only
def test_one_model_at_a_time():
    with emulated_streams():
        with pytest.raises(RuntimeError, match="a stream model is active already"):
            with emulated_streams():
                pass


def test_the_host_has_no_streams():
    # Host tables order nothing (one call per op); GPU tables use torch.cuda's streams.
    assert streams.backend(torch.device("cpu")) is None
    assert isinstance(streams.backend(torch.device("cuda")), streams.CudaStreams)
    if not EMULATED:
        with pytest.raises(RuntimeError, match="needs DYNEMB_EXECUTOR=cuda-emulated"):
            with emulated_streams():
                pass


def test_the_seed_comes_from_the_environment(monkeypatch):
    monkeypatch.setenv("DYNEMB_EMULATION_SEED", "12")
    assert StreamModel().seed == 12
    assert StreamModel(3).seed == 3


@emulated_only
def test_a_new_table_is_filled_before_another_stream_uses_it(monkeypatch):
    # Its buffers are zeroed on the stream current at construction, its first writer.
    def run() -> torch.Tensor:
        keys = torch.arange(8)
        with emulated_streams() as model:
            with model.use(model.new_stream("construction")):
                table = _table()
            table.insert_or_assign(keys, torch.ones(8, 4))
            streams.host_read(keys)  # runs the default stream's queue alone
        return table.find(keys)[1]

    assert bool(run().all())
    monkeypatch.setattr(StreamModel, "wait", lambda self, stream, event: None)
    assert not bool(run().any())  # the zeroing ran after the insert
