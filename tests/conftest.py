"""Shared fixtures: every table test takes a `device` (cpu always, cuda when built and present;
``DYNEMB_TEST_CUDA`` switches cuda on or off: see tests/support/devices.py).

The marker ``no_emulated_pass("reason")`` skips a test in the suite's second pass
(DYNEMB_EXECUTOR=cuda-emulated), for tests that exercise no executor-specific code: the
first pass already ran them on the same Python and file code.

The emulated executor runs a block's threads in an order drawn from
``DYNEMB_EMULATION_SEED`` (csrc/emulated/lockstep.h). The suite draws one when it is unset,
prints it in the header and under every failure: set it to replay a failing order."""

import os
import random

import pytest
import torch

from tests.support.devices import test_devices

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


def pytest_configure(config):
    # Before xdist starts its workers: they inherit the variable, so all share one seed.
    os.environ.setdefault("DYNEMB_EMULATION_SEED", str(random.randrange(2**32)))
    # `make sanitize-asan` names the sanitized build's folder: every process (each xdist
    # worker too) must have imported the extension from there, not the normal build.
    expected = os.environ.get("DYNEMB_EXPECT_EXTENSION_IN")
    if expected:
        import dynemb._C

        if os.path.abspath(expected) + os.sep not in os.path.abspath(dynemb._C.__file__):
            raise pytest.UsageError(
                f"DYNEMB_EXPECT_EXTENSION_IN={expected}, but dynemb._C was imported from "
                f"{dynemb._C.__file__}"
            )


def pytest_report_header(config):
    return f"DYNEMB_EMULATION_SEED={os.environ['DYNEMB_EMULATION_SEED']}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.failed:
        seed = os.environ["DYNEMB_EMULATION_SEED"]
        report.sections.append(("emulated lane order", f"DYNEMB_EMULATION_SEED={seed} replays it"))
