"""The tile scans of a bucket (csrc/core/bucket_tile.h: find, first free slot in probe
order, eviction victim), written once for every executor, give the answers of their
definitions (a plain loop over the bucket each) on random buckets of 16 to 256 slots,
empty, full and mixed, with ties of score and digest, pins and every eviction floor:
tiles of 8, 16 and 32 lanes on the emulated executor's lockstep warps, under several
lane orders, and the one-lane SerialTile that the CPU executor runs; the CPU's
BucketVictims too. And a row initialised by a tile's lanes (init_row with Lanes) equals
init_row's, a row copied or zeroed by them (16-byte chunks) the serial copy at every
misalignment, each element moved by its owner lane. tests/native/tile_bucket.cpp holds
the kernels; it is built here with the host compiler."""

import os
import subprocess
import sys

import pytest

from tests.support.native_programs import build_native_program

pytestmark = pytest.mark.no_emulated_pass("builds and runs its own program: no executor choice")


@pytest.fixture(scope="module")
def program(tmp_path_factory):
    return build_native_program("tile_bucket.cpp", tmp_path_factory.mktemp("tile_bucket"))


@pytest.mark.parametrize("data_seed, lane_seed", [(1, 1), (2, 2), (3, 3), (4, 11)])
def test_tile_scans_give_the_defined_answers(program, data_seed, lane_seed):
    env = dict(os.environ, DYNEMB_EMULATION_SEED=str(lane_seed))
    done = subprocess.run(
        [str(program), str(data_seed)], capture_output=True, text=True, timeout=120, env=env
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stdout + done.stderr


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
