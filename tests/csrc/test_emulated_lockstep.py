"""The emulated executor's lockstep warps and blocks (csrc/emulated/lockstep.h): each warp
collective, __syncthreads with __shared__ memory, cooperative-groups tiles and a spin lock
inside a block against CUDA's documented semantics, and the errors that stand where a GPU
would hang. tests/native/lockstep_kernels.cpp holds the kernels; it is built here with
the host compiler from the same sources as the extension's emulated executor."""

import os
import re
import subprocess
import sys

import pytest

from tests.support.native_programs import ROOT, build_native_program

pytestmark = pytest.mark.no_emulated_pass("builds and runs its own program: no executor choice")


@pytest.fixture(scope="module")
def program(tmp_path_factory):
    return build_native_program("lockstep_kernels.cpp", tmp_path_factory.mktemp("lockstep"))


def run(program, *args, seed=None):
    env = dict(os.environ)
    if seed is not None:
        env["DYNEMB_EMULATION_SEED"] = str(seed)
    return subprocess.run(
        [str(program), *args], capture_output=True, text=True, timeout=120, env=env
    )


def case_names():
    text = (ROOT / "tests/native/lockstep_kernels.cpp").read_text()
    table = text[text.index("cases = {") : text.index("};", text.index("cases = {"))]
    return re.findall(r'\{"(\w+)",', table)


@pytest.mark.parametrize("case", case_names())
def test_primitive(program, case):
    done = run(program, case)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stdout + done.stderr


def test_every_case_is_collected(program):
    listed = run(program, "list").stdout.split()
    assert sorted(listed) == sorted(case_names())
    assert len(listed) == 10


def test_lane_order_is_drawn_from_the_seed(program):
    """One seed, one order (a failure replays); another seed, another; never the
    threads' own order."""
    first, again, other = (run(program, "order", seed=s).stdout for s in (7, 7, 8))
    assert first == again
    assert first != other
    for line in first.splitlines():
        order = [int(t) for t in line.split()]
        assert sorted(order) == list(range(64)) and order != list(range(64))
    launches = first.splitlines()
    assert launches[0] != launches[1], "each launch draws its own order"


def test_bad_seed_is_refused(program):
    done = run(program, "votes", seed="twelve")
    assert done.returncode != 0
    assert "DYNEMB_EMULATION_SEED must be a decimal integer, got 'twelve'" in done.stderr


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
