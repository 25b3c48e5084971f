"""Builds a test program of tests/native over the emulated executor's runtime (the
same sources as the extension's emulated executor), with the host compiler."""

import os
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

import pytest
import torch.utils.cpp_extension

ROOT = Path(__file__).resolve().parents[2]
# The emulated executor's runtime: the grid, lockstep blocks and their rules, fibers,
# the memory model, the count of table accesses (the Makefile's EMULATION_RUNTIME).
EMULATION_RUNTIME = [
    ROOT / "csrc/emulated" / name
    for name in (
        "launch.cpp",
        "lockstep.cpp",
        "lockstep_rules.cpp",
        "fiber.cpp",
        "memory_model.cpp",
        "access_count.cpp",
    )
]


def build_native_program(source: str, directory: Path, flags: Sequence[str] = ()) -> Path:
    """Compiles tests/native/``source`` with the runtime into ``directory``, with the
    compiler ``flags`` added (``-fsanitize=thread``); skips the test when no C++
    compiler is on PATH, fails it with the compiler's errors."""
    compiler = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")
    if compiler is None:
        pytest.skip("no C++ compiler on PATH")
    binary = directory / Path(source).stem
    include = torch.utils.cpp_extension.include_paths()[0]
    command = [compiler, "-std=c++20", "-O1", "-g", "-Wall", "-Werror", "-Wno-unknown-pragmas"]
    command += flags
    command += [f"-I{ROOT / 'csrc'}", "-isystem", include, str(ROOT / "tests/native" / source)]
    command += [*map(str, EMULATION_RUNTIME), "-o", str(binary), "-pthread"]
    built = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr
    return binary
