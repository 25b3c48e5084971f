"""Shared fixtures: every table test takes a `device` (cpu always, cuda when built and present;
``DYNEMB_TEST_CUDA`` switches cuda on or off: see tests/devices.py)."""

import pytest
import torch

from tests.devices import test_devices

DEVICES = test_devices()


@pytest.fixture(params=DEVICES)
def device(request):
    return torch.device(request.param)
