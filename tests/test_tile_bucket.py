"""The tile scans of a bucket (csrc/core/bucket_tile.h: find, first free slot in probe
order, eviction victim) give the serial scans' answers (csrc/core/bucket.h) on random
buckets, empty, full and mixed, with ties of score and digest, pins and every eviction
floor: tiles of 8, 16 and 32 lanes on the emulated executor's lockstep warps, under
several lane orders, and the one-lane SerialTile; and a row initialised by a tile's lanes
(init_row with Lanes) equals init_row's. tests/native/tile_bucket.cpp holds the kernels;
it is built here with the host compiler."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch.utils.cpp_extension

pytestmark = pytest.mark.no_emulated_pass("builds and runs its own program: no executor choice")

ROOT = Path(__file__).resolve().parents[1]
SOURCES = [
    ROOT / "tests/native/tile_bucket.cpp",
    ROOT / "csrc/emulated/launch.cpp",
    ROOT / "csrc/emulated/lockstep.cpp",
    ROOT / "csrc/emulated/fiber.cpp",
]


@pytest.fixture(scope="module")
def program(tmp_path_factory):
    compiler = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")
    if compiler is None:
        pytest.skip("no C++ compiler on PATH")
    binary = tmp_path_factory.mktemp("tile_bucket") / "tile_bucket"
    include = torch.utils.cpp_extension.include_paths()[0]
    command = [compiler, "-std=c++20", "-O1", "-g", "-Wall", "-Werror", "-Wno-unknown-pragmas"]
    command += [f"-I{ROOT / 'csrc'}", "-isystem", include, *map(str, SOURCES)]
    command += ["-o", str(binary), "-pthread"]
    built = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr
    return binary


@pytest.mark.parametrize("data_seed, lane_seed", [(1, 1), (2, 2), (3, 3), (4, 11)])
def test_tile_scans_match_the_serial_ones(program, data_seed, lane_seed):
    env = dict(os.environ, DYNEMB_EMULATION_SEED=str(lane_seed))
    done = subprocess.run(
        [str(program), str(data_seed)], capture_output=True, text=True, timeout=120, env=env
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stdout + done.stderr


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
