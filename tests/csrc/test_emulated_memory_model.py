"""The emulated executor is no stronger than CUDA (csrc/emulated/memory_model.h): under
ThreadSanitizer, a kernel that races on a GPU races in emulation, and one that CUDA
orders (fences, __syncwarp, tile.sync(), __syncthreads, acquire loads) is clean.
tests/native/litmus_kernels.cpp holds the kernels; it is built here with
-fsanitize=thread (`make sanitize-tsan` passes the one it built in DYNEMB_TSAN_LITMUS),
and each case runs in its own process, which TSan ends with exit code 66 on a report."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.native_programs import build_native_program

pytestmark = pytest.mark.no_emulated_pass("builds and runs its own program: no executor choice")

TSAN_EXIT = 66

# The oracle: CUDA's memory model, case by case, and the kernel each race is in.
RACY = {
    "publish_plain": "publish_kernel",  # a flag, no fence: the data is not published
    "publish_writer_fence_only": "publish_kernel",  # no fence after reading the flag
    "lock_unfenced": "lock_kernel",  # atomicCAS / atomicExch are relaxed
    "shared_nothing": "neighbour_kernel",
    "shared_ballot": "neighbour_kernel",  # warp votes do not order memory
    "shared_shuffle": "neighbour_kernel",  # nor do shuffles
    "shared_other_warp_syncwarp": "neighbour_kernel",  # __syncwarp orders its warp only
}
ORDERED = [
    "publish_fences",
    "publish_acquire_load",
    "lock_fenced",
    "shared_syncwarp",
    "shared_tile_sync",
    "shared_other_warp_syncthreads",
]


@pytest.fixture(scope="module")
def program(tmp_path_factory):
    built = os.environ.get("DYNEMB_TSAN_LITMUS")
    if built:
        return Path(built)
    return build_native_program(
        "litmus_kernels.cpp",
        tmp_path_factory.mktemp("litmus"),
        flags=["-fsanitize=thread", "-Wno-tsan"],
    )


def run(program, *args):
    env = dict(os.environ, TSAN_OPTIONS=f"halt_on_error=1:exitcode={TSAN_EXIT}")
    return subprocess.run(
        [str(program), *args], capture_output=True, text=True, timeout=300, env=env
    )


def test_every_case_has_an_expectation(program):
    listed = run(program, "list").stdout.split()
    assert sorted(listed) == sorted([*RACY, *ORDERED])


@pytest.mark.parametrize("case", sorted(RACY))
def test_race_is_reported(program, case):
    done = run(program, case)
    assert done.returncode == TSAN_EXIT, done.stdout + done.stderr
    report = done.stderr
    assert "WARNING: ThreadSanitizer: data race" in report, report
    # The race is the kernel's own, on both sides (not one in the emulation's runtime):
    # the top frames of the access and of the previous one are in it.
    first = report[report.index("WARNING: ThreadSanitizer: data race") :]
    tops = re.findall(
        r"(?i)^ {2}(?:previous )?(?:atomic )?(?:read|write) of size.*\n(.*)\n(.*)", first, re.M
    )
    assert len(tops) >= 2, report
    for top in tops[:2]:
        assert any(RACY[case] in frame for frame in top), report


@pytest.mark.parametrize("case", ORDERED)
def test_ordered_pattern_is_clean(program, case):
    done = run(program, case)
    assert done.returncode == 0 and done.stdout.endswith("ok\n"), done.stdout + done.stderr
    assert "ThreadSanitizer" not in done.stderr, done.stderr


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
