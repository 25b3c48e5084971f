"""CaptureBuffers lends host buffers by name and takes them back; ``reserve`` makes one
ready (its pages touched) before a capture asks for it; a publisher reserves its
capture's buffers between deltas, so that the capture at a boundary allocates none;
``ScoredHashTable.stored_entries`` reads each stored key once, in slot order."""

import threading
import time

import pytest
import torch

from dynemb import BatchedDynamicEmbeddingTables, DynamicEmbPoolingMode, DynamicEmbTableOptions
from dynemb.deltas import DeltaPublisher
from dynemb.deltas import buffers as buffers_module
from dynemb.deltas.buffers import GROWTH, CaptureBuffers
from dynemb.deltas.capture import Capture
from dynemb.optimizer import EmbOptimType
from dynemb.table import slot_access
from dynemb.table.scored_hash_table import ScoredHashTable


def _address(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def test_a_reserved_buffer_is_the_one_a_take_of_its_size_gets():
    buffers = CaptureBuffers()
    assert buffers.reserve("t.rows", 10, 4, torch.float32)
    assert not buffers.reserve("t.rows", 10, 4, torch.float32)  # one is ready
    assert not buffers.reserve("t.rows", int(10 * GROWTH), 4, torch.float32)  # room to grow
    got = buffers.take("t.rows", 10, 4, torch.float32)
    assert got.shape == (10, 4) and got.dtype == torch.float32
    assert torch.count_nonzero(got) == 0  # touched: zeroed
    assert buffers.reserve("t.rows", 10, 4, torch.float32)  # the ready one is lent
    buffers.give(got)
    again = buffers.take("t.rows", 10, 4, torch.float32)  # the largest free one
    assert again.untyped_storage().nbytes() >= got.untyped_storage().nbytes()


def test_reserve_allocates_anew_for_more_rows_another_dtype_or_another_name():
    buffers = CaptureBuffers()
    buffers.reserve("t.rows", 10, 4, torch.float32)
    assert buffers.reserve("t.rows", 100, 4, torch.float32)
    assert buffers.reserve("t.rows", 10, 4, torch.float16)
    assert buffers.reserve("u.rows", 10, 4, torch.float32)
    assert buffers.reserve("t.scores", 10, 0, torch.int64)
    assert not buffers.reserve("t.scores", 10, 0, torch.int64)
    assert buffers.take("t.rows", 100, 4, torch.float32).shape == (100, 4)


def _model() -> BatchedDynamicEmbeddingTables:
    options = [DynamicEmbTableOptions(dim=8, max_capacity=4096) for _ in range(2)]
    return BatchedDynamicEmbeddingTables(
        options, [0, 1], pooling_mode=DynamicEmbPoolingMode.SUM,
        optimizer=EmbOptimType.EXACT_ROWWISE_ADAGRAD, learning_rate=0.1,
        table_names=["a", "b"],
    )  # fmt: skip


def _train(model, step: int) -> None:
    g = torch.Generator().manual_seed(step)
    keys = torch.randint(0, 1 << 40, (2 * 8 * 64,), generator=g)
    model(keys, torch.arange(0, keys.numel() + 1, 64)).sum().backward()


def test_the_capture_at_a_boundary_allocates_nothing_once_the_writer_thread_reserved(
    tmp_path, monkeypatch
):
    """Each table's rows and scores buffers are allocated on the writer thread between
    deltas, sized by the keys touched so far: the first capture faults no fresh page,
    and neither does a later, larger one."""
    allocations = []  # the threads that allocated capture buffers (this test's)
    allocate = buffers_module.allocate

    def spy(*args, **kwargs):
        thread = threading.current_thread()
        if not thread.name.startswith("DeltaPublisher") or str(tmp_path) in thread.name:
            allocations.append(thread)
        return allocate(*args, **kwargs)

    monkeypatch.setattr(buffers_module, "allocate", spy)
    reserves, reserve, mine = [], Capture.reserve, []

    def counted(self):
        reserve(self)
        if self in mine:  # not another test's publisher left open
            reserves.append(threading.current_thread())

    monkeypatch.setattr(Capture, "reserve", counted)
    model = _model()
    publisher = DeltaPublisher(model, tmp_path)
    mine.append(publisher._capture)
    publisher.publish_base()
    for rounds in (2, 6):  # the second delta touches more keys than the first
        for step in range(rounds):
            _train(model, 100 * rounds + step)
        seen = len(reserves)  # a reservation begun after the steps ended
        deadline = time.monotonic() + 30
        while len(reserves) < seen + 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert len(reserves) >= seen + 2, "the writer thread never reserved"
        publisher.publish()
    writer = set(reserves)
    assert len(writer) == 1 and threading.current_thread() not in writer
    # Every capture buffer came from the writer thread, the captures' too (they run on
    # threads of their own: none of them allocated).
    assert len(allocations) >= 4 and set(allocations) == writer  # 2 tables x rows, scores
    publisher.close()


@pytest.mark.parametrize("ratio", [0, 1 << 30], ids=["by-sort", "by-mark"])
def test_stored_entries_reads_each_stored_key_once_in_slot_order(monkeypatch, ratio):
    monkeypatch.setattr(slot_access, "MARK_RATIO", ratio)
    table = ScoredHashTable(dim=3, capacity=256, extra_columns=1)
    table.find_or_insert(torch.arange(100, 200))
    keys = torch.tensor([150, 7, 150, 120, 199, 7, 300, 120, 101])  # repeats, 7 and 300 absent
    buffers = CaptureBuffers()
    stored, rows, scores, missing = table.stored_entries(keys, buffers.out("t"))
    assert sorted(stored.tolist()) == [101, 120, 150, 199]  # each once
    slots = table.find_slots(stored)
    assert torch.equal(slots, slots.sort().values)  # slot order
    expected_rows, expected_scores, _ = table.find_entries(stored)
    assert torch.equal(rows, expected_rows) and torch.equal(scores, expected_scores)
    assert missing.tolist() == [7, 7, 300]  # repeats kept, in the order given
    every_one_stored = keys[(keys >= 100) & (keys < 200)]  # the path without a mask
    stored, rows, scores, missing = table.stored_entries(every_one_stored, buffers.out("u"))
    assert sorted(stored.tolist()) == [101, 120, 150, 199] and missing.numel() == 0
    assert torch.equal(rows, table.find_entries(stored)[0])
