"""Where a table's buffers live (dynemb/table/placement.py), and tables built by it.

The CUDA placements are checked as data here (planning a placement needs no GPU);
the tables are built on the CPU with the GPU layout forced, as the emulated CUDA
executor builds them. Tests that need a GPU run under ``make gpu-test``.
"""

import pytest
import torch

import dynemb
from dynemb import _ops
from dynemb.table import placement
from dynemb.table.placement import (
    BUFFERS,
    Memory,
    backing_fast_rows,
    canonical_device,
    table_placement,
)

SLOT_BUFFERS = ("digests", "keys", "scores", "timestamps", "overflow")


@pytest.fixture
def gpu_layout(monkeypatch):
    """The GPU layout on CPU tensors, as under DYNEMB_EXECUTOR=cuda-emulated."""
    monkeypatch.setattr(placement._ops, "executor", lambda: "cuda-emulated")


@pytest.fixture
def cpu_layout(monkeypatch):
    monkeypatch.setattr(placement._ops, "executor", lambda: "cpu")


def test_cpu_in_memory_puts_every_buffer_on_the_device(cpu_layout):
    p = table_placement("cpu", spilled=False)
    assert not p.gpu_layout and not p.registers_host_memory
    assert p.memory == dict.fromkeys(BUFFERS, Memory.DEVICE)


def test_cpu_spilled_maps_the_slot_buffers_and_keeps_fast_rows_and_locks(cpu_layout):
    p = table_placement("cpu", spilled=True)
    for name in (*SLOT_BUFFERS, "slow_values"):
        assert p.memory[name] is Memory.FILE, name
    assert p.memory["values"] is Memory.DEVICE and p.memory["locks"] is Memory.DEVICE
    assert p.resident_spill_buffers() == ("values",)


def test_cuda_keeps_metadata_and_fast_rows_in_device_memory_slow_rows_on_the_host():
    p = table_placement("cuda:1", spilled=False)
    assert p.gpu_layout and p.registers_host_memory and p.device == torch.device("cuda:1")
    assert p.memory["slow_values"] is Memory.HOST
    for name in (*SLOT_BUFFERS, "values", "locks"):
        assert p.memory[name] is Memory.DEVICE, name


def test_cuda_spilled_maps_only_the_slow_rows_and_flushes_the_rest():
    p = table_placement("cuda", spilled=True)
    assert p.memory["slow_values"] is Memory.FILE
    assert set(p.resident_spill_buffers()) == {*SLOT_BUFFERS, "values"}


def test_emulated_executor_gets_the_gpu_layout_over_host_memory(gpu_layout):
    p = table_placement("cpu", spilled=False)
    assert p.gpu_layout and not p.registers_host_memory
    assert p.memory["slow_values"] is Memory.HOST
    assert table_placement("cpu", spilled=True).memory["keys"] is Memory.DEVICE


def test_cached_tables_slow_tier_is_all_host_rows_on_a_gpu_only(cpu_layout):
    assert backing_fast_rows("cuda:0") == 0
    assert backing_fast_rows("cpu") is None


def _hybrid(**kwargs):
    return dynemb.ScoredHashTable(
        dim=4, capacity=1024, bucket_capacity=16, fast_rows=64, extra_columns=1, **kwargs
    )


def test_hybrid_table_in_the_gpu_layout_round_trips_rows_through_both_tiers(gpu_layout):
    t = _hybrid()
    s = t.buffers  # the test inspects the buffers placement chose
    assert s.placement.gpu_layout
    assert s.values.shape == (64, 5) and s.slow_values.shape == (960, 5)
    assert s.slow_values.data_ptr() != s.values.data_ptr()
    keys = torch.arange(200, dtype=torch.int64) * 7919
    rows = torch.randn(200, 4)
    t.insert_or_assign(keys, rows)
    got, found = t.find(keys)
    assert bool(found.all())
    torch.testing.assert_close(got, rows, rtol=0, atol=0)
    slots = _ops.table_find_slots(s.tensors(), keys)
    assert bool((slots >= 64).any()) and bool((slots < 64).any())  # both tiers in use
    torch.testing.assert_close(s.rows(slots, 4), rows, rtol=0, atol=0)


@pytest.mark.parametrize("layout", ["cpu_layout", "gpu_layout"])
def test_spilled_table_reopens_in_either_layout(layout, request, tmp_path):
    request.getfixturevalue(layout)
    keys = torch.arange(100, dtype=torch.int64) * 31 + 5
    rows = torch.randn(100, 4)
    t = _hybrid(spill_directory=str(tmp_path / "spill"))
    t.insert_or_assign(keys, rows)
    t.flush()
    del t
    t = _hybrid(spill_directory=str(tmp_path / "spill"))
    got, found = t.find(keys)
    assert bool(found.all()) and t.size() == 100
    torch.testing.assert_close(got, rows, rtol=0, atol=0)


def test_a_spill_directory_written_by_one_layout_opens_in_the_other(monkeypatch, tmp_path):
    keys = torch.arange(50, dtype=torch.int64) + 1000
    rows = torch.randn(50, 4)
    monkeypatch.setattr(placement._ops, "executor", lambda: "cpu")
    t = _hybrid(spill_directory=str(tmp_path / "spill"))
    t.insert_or_assign(keys, rows)
    t.flush()
    del t
    monkeypatch.setattr(placement._ops, "executor", lambda: "cuda-emulated")
    t = _hybrid(spill_directory=str(tmp_path / "spill"))
    got, found = t.find(keys)
    assert bool(found.all())
    torch.testing.assert_close(got, rows, rtol=0, atol=0)


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")


@cuda
def test_cuda_hybrid_table_puts_the_slow_tier_in_page_locked_host_memory():
    t = _hybrid(device="cuda")
    s = t.buffers  # the test inspects the buffers placement chose
    assert s.values.is_cuda and s.keys.is_cuda
    assert s.slow_values.device.type == "cpu" and s.slow_values.is_pinned()
    keys = torch.arange(200, dtype=torch.int64, device="cuda") * 7919
    rows = torch.randn(200, 4, device="cuda")
    t.insert_or_assign(keys, rows)
    got, found = t.find(keys)
    assert bool(found.all())
    torch.testing.assert_close(got, rows, rtol=0, atol=0)


@cuda
def test_cuda_op_checks_reject_a_pageable_or_device_slow_tier():
    t = _hybrid(device="cuda")
    s = t.buffers  # the test builds a wrong placement on purpose
    keys = torch.arange(4, dtype=torch.int64, device="cuda")
    for wrong in (s.slow_values.clone(), s.slow_values.to("cuda")):
        table = s.tensors()
        table[7] = wrong
        with pytest.raises(ValueError, match="table.slow_values"):
            _ops.table_find_slots(table, keys)
    table = s.tensors()
    table[1] = s.keys.cpu()
    with pytest.raises(ValueError, match="table.keys"):
        _ops.table_find_slots(table, keys)


def test_canonical_device_leaves_cpu_and_indexed_devices_alone():
    assert canonical_device("cpu") == torch.device("cpu")
    assert canonical_device(torch.device("cuda", 1)) == torch.device("cuda", 1)


@cuda
def test_a_table_built_on_bare_cuda_accepts_its_own_keys():
    """Found on an H100: a table built with device="cuda" kept the bare name, and
    torch.device("cuda") != keys.device ("cuda:0"), so restore refused its own keys."""
    assert canonical_device("cuda") == torch.device("cuda", torch.cuda.current_device())
    t = dynemb.ScoredHashTable(dim=4, capacity=256, device="cuda")
    keys = torch.arange(8, dtype=torch.int64, device="cuda")
    assert t.device == keys.device
    t.insert_or_assign(keys, torch.ones(8, 4, device="cuda"))
    assert bool(t.find(keys)[1].all())
