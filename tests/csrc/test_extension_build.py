"""How the extension is linked: things that break at run time, not at build time."""

import shutil
import subprocess

import dynemb._C as _C
import pytest
import torch

from dynemb import _ops

pytestmark = pytest.mark.no_emulated_pass("how the extension is linked: the same in every pass")


@pytest.mark.skipif(shutil.which("readelf") is None, reason="needs binutils' readelf")
def test_the_extension_uses_the_shared_libstdcxx():
    """A private (static) libstdc++ has streams without a locale: torch's messages lose
    their numbers, or the process crashes formatting one (a g++ that links
    -static-libstdc++ gives one); setup.py names the shared one first."""
    dynamic = subprocess.run(
        ["readelf", "-d", _C.__file__], check=True, capture_output=True, text=True
    ).stdout
    assert "libstdc++.so" in dynamic, dynamic


def test_an_error_message_keeps_its_numbers():
    with pytest.raises(ValueError, match=r"dynemb.crc32: .*-1"):
        _ops.crc32(torch.zeros(4, dtype=torch.uint8), -1)
