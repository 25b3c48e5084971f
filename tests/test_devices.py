"""The test-device switch (DYNEMB_TEST_CUDA) and the backend choice of multi-process tests."""

import pytest
import torch

from tests.support import devices

pytestmark = pytest.mark.no_emulated_pass("the test-device switch and backend choice: Python only")


def test_unset_gives_cpu_and_cuda_only_when_ready(monkeypatch):
    monkeypatch.delenv(devices.SWITCH, raising=False)
    expected = ["cpu", "cuda"] if devices.cuda_ready() else ["cpu"]
    assert devices.test_devices() == expected


def test_zero_gives_cpu_only(monkeypatch):
    monkeypatch.setenv(devices.SWITCH, "0")
    assert devices.test_devices() == ["cpu"]


def test_one_requires_cuda(monkeypatch):
    monkeypatch.setenv(devices.SWITCH, "1")
    if devices.cuda_ready():
        assert devices.test_devices() == ["cpu", "cuda"]
    else:
        with pytest.raises(RuntimeError, match="DYNEMB_TEST_CUDA=1 asks for the cuda test device"):
            devices.test_devices()


def test_other_values_are_an_error(monkeypatch):
    monkeypatch.setenv(devices.SWITCH, "yes")
    with pytest.raises(RuntimeError, match="must be 0, 1 or unset, got 'yes'"):
        devices.test_devices()


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_cpu_ranks_use_gloo(monkeypatch, world_size):
    monkeypatch.delenv(devices.SWITCH, raising=False)
    assert devices.process_group_backend(world_size) == "gloo"


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_cuda_ranks_use_nccl_only_when_every_rank_has_a_gpu(monkeypatch, world_size):
    monkeypatch.delenv(devices.SWITCH, raising=False)
    enough = devices.cuda_ready() and torch.cuda.device_count() >= world_size
    expected = "nccl" if enough else "gloo"
    assert devices.process_group_backend(world_size, "cuda") == expected
    monkeypatch.setenv(devices.SWITCH, "0")  # cuda switched off: gloo whatever the GPUs
    assert devices.process_group_backend(world_size, "cuda") == "gloo"
