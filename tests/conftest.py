"""Shared fixtures: every table test takes a `device` (cpu always, cuda when built and present;
``DYNEMB_TEST_CUDA`` switches cuda on or off: see tests/devices.py).

The marker ``no_emulated_pass("reason")`` skips a test in the suite's second pass
(DYNEMB_EXECUTOR=cuda-emulated), for tests that exercise no executor-specific code: the
first pass already ran them on the same Python and file code."""

import os

import pytest
import torch

from tests.devices import test_devices

DEVICES = test_devices()


@pytest.fixture(params=DEVICES)
def device(request):
    return torch.device(request.param)


def pytest_collection_modifyitems(config, items):
    if os.environ.get("DYNEMB_EXECUTOR") != "cuda-emulated":
        return
    for item in items:
        marker = item.get_closest_marker("no_emulated_pass")
        if marker is None:
            continue
        if not marker.args or not isinstance(marker.args[0], str) or not marker.args[0]:
            raise pytest.UsageError(f"{item.nodeid}: no_emulated_pass needs a reason string")
        item.add_marker(pytest.mark.skip(reason=f"no_emulated_pass: {marker.args[0]}"))
