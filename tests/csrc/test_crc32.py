"""dynemb's CRC-32 (checkpoint file checks) equals zlib.crc32 for every length,
alignment and continuation."""

import zlib

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dynemb import _ops
from dynemb.dump_files.format import crc32_combine

pytestmark = pytest.mark.no_emulated_pass(
    "crc32 is a host op (torch.ops.dynemb), the same in every pass"
)


def _bytes(n: int, seed: int) -> bytes:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n,), dtype=torch.uint8, generator=g).numpy().tobytes()


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(0, 600),
    offset=st.integers(0, 15),
    start=st.sampled_from([0, 1, 0xDEADBEEF, 0xFFFFFFFF]),
)
def test_small_buffers_any_alignment_and_start(n, offset, start):
    data = _bytes(n + offset, seed=n)
    view = torch.frombuffer(bytearray(data), dtype=torch.uint8)[offset:] if data else None
    if view is None:
        view = torch.empty(0, dtype=torch.uint8)
    assert _ops.crc32(view, start) == zlib.crc32(data[offset:], start)


@pytest.mark.parametrize("n", [64, 65, 127, 4096, (1 << 20) + 13])
def test_continuation_equals_one_pass(n):
    data = _bytes(n, seed=7)
    t = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    whole = _ops.crc32(t)
    assert whole == zlib.crc32(data)
    cut = n // 3
    assert _ops.crc32(t[cut:], _ops.crc32(t[:cut])) == whole


def test_bad_arguments():
    with pytest.raises(TypeError, match="dtype Byte"):
        _ops.crc32(torch.zeros(4, dtype=torch.int32))
    with pytest.raises(ValueError, match="crc"):
        _ops.crc32(torch.zeros(4, dtype=torch.uint8), -1)


@settings(max_examples=40, deadline=None)
@given(a=st.integers(0, 300), b=st.integers(0, 300))
def test_combine_equals_the_crc_of_the_concatenation(a, b):
    first, second = _bytes(a, seed=a), _bytes(b, seed=1000 + b)
    combined = crc32_combine(zlib.crc32(first), zlib.crc32(second), len(second))
    assert combined == zlib.crc32(first + second)
