"""DYNEMB_EXECUTOR picks the executor once, at import; dynemb.executor() names it."""

import os
import subprocess
import sys

import pytest
import torch

import dynemb

# The tests that start a process set its DYNEMB_EXECUTOR themselves: the pass's own
# executor changes nothing in them.
_OWN_PROCESS = pytest.mark.no_emulated_pass("starts a process with its own DYNEMB_EXECUTOR")


def _import_with(value: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, DYNEMB_EXECUTOR=value)
    code = "import dynemb; print(dynemb.executor())"
    return subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )


def test_executor_names_the_one_this_process_uses():
    # Unset: "cuda" in a CUDA build with a GPU present (failed on the H100 run when
    # this test assumed no GPU), else "cpu".
    with_gpu = dynemb._C.with_cuda and torch.cuda.is_available()
    expected = os.environ.get("DYNEMB_EXECUTOR") or ("cuda" if with_gpu else "cpu")
    assert dynemb.executor() == expected


@_OWN_PROCESS
@pytest.mark.parametrize("value, expected", [("cuda-emulated", "cuda-emulated"), ("cpu", "cpu")])
def test_the_variable_selects_the_executor(value, expected):
    done = _import_with(value)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == expected


@_OWN_PROCESS
@pytest.mark.parametrize("value", ["gpu", "CUDA-EMULATED"])
def test_an_unknown_executor_is_an_error_at_import(value):
    done = _import_with(value)
    assert done.returncode != 0
    assert f"DYNEMB_EXECUTOR={value!r} is not an executor" in done.stderr
    assert "cpu, cuda, cuda-emulated" in done.stderr


@_OWN_PROCESS
@pytest.mark.skipif(dynemb._C.with_cuda, reason="this build has the CUDA executor")
def test_cuda_without_a_cuda_build_is_an_error_at_import():
    done = _import_with("cuda")
    assert done.returncode != 0
    assert "built without CUDA" in done.stderr
