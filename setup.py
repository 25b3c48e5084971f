"""Builds dynemb._C: the CPU and emulated CUDA executors always; the CUDA executor with
DYNEMB_WITH_CUDA=1.

DYNEMB_SANITIZE=1 (`make sanitize`) builds an AddressSanitizer + UndefinedBehaviorSanitizer
copy of the CPU build into build/sanitize/site instead: a copy of the dynemb package tree with
the sanitized _C*.so, put first on PYTHONPATH by the sanitizer run. It never replaces the
normal (in-place or installed) build.

The CUDA sources (csrc/cuda/*.cu) are torch-free launchers; csrc/torch/*_cuda.cpp
registers them with the dispatcher and is compiled only for a CUDA build of torch.
"""

import glob
import os
import shutil

from setuptools import find_packages, setup
from torch.utils import cpp_extension

ROOT = os.path.dirname(os.path.abspath(__file__))


# Sources and compiler/linker flags, as literals: `make cuda-check` reads them from here
# (tools/cuda_check.py) to compile and link the CUDA build in CI exactly as this file does.
# A file matching a CUDA pattern is built only with DYNEMB_WITH_CUDA=1.
# csrc/emulated: the CUDA executor's sources built for the host (the emulated executor,
# DYNEMB_EXECUTOR=cuda-emulated), in every build.
CPU_SOURCES = ["csrc/cpu/*.cpp", "csrc/torch/*.cpp", "csrc/emulated/*.cpp"]
CUDA_SOURCES = ["csrc/cuda/*.cu", "csrc/torch/*_cuda.cpp"]
# -ffp-contract=off (g++) and --fmad=false (nvcc): no fused multiply-add contraction, so
# every code path, on either executor, and the reference formulas in tests round the same way
# (a fused multiply-add happens only where the code calls fmaf: core/pooling.h's forward).
CXX_FLAGS = [
    "-O3",
    "-std=c++20",
    "-fopenmp",
    "-march=native",
    "-ffp-contract=off",
    "-Wall",
    "-Wno-unused-function",
    "-Wno-unknown-pragmas",
]
# torch adds -D__CUDA_NO_HALF_CONVERSIONS__ and friends to every nvcc command; our .cu files
# include no ATen header (no c10::Half to clash with) and convert __half/__nv_bfloat16 with
# static_cast, so they take CUDA's default half/bfloat16 operators back.
NVCC_FLAGS = [
    "-O3",
    "-std=c++20",
    "--fmad=false",
    "-U__CUDA_NO_HALF_OPERATORS__",
    "-U__CUDA_NO_HALF_CONVERSIONS__",
    "-U__CUDA_NO_BFLOAT16_CONVERSIONS__",
    "-U__CUDA_NO_HALF2_OPERATORS__",
]
CUDA_DEFINES = ["-DDYNEMB_WITH_CUDA"]
# The shared libstdc++, named before the compiler's own: a g++ that links it statically
# (-static-libstdc++, as some g++ wrappers do) gives the extension a private
# copy whose streams have no locale, so torch's error messages lose their numbers or
# crash the process while formatting one (tests/csrc/test_extension_build.py). `-lstdc++`
# is replaced by the path of the one torch runs on (`_shared_libstdcxx`): a compiler whose
# own library folder holds only libstdc++.a resolves `-lstdc++` to that archive.
LINK_FLAGS = ["-fopenmp", "-Wl,--push-state,--no-as-needed", "-lstdc++", "-Wl,--pop-state"]
# DYNEMB_SANITIZE=1: these replace -O3 (-O1 -g: readable reports at a bearable speed); the
# first UBSan report aborts the process, so no test can pass over undefined behaviour.
SANITIZE_FLAGS = [
    "-O1",
    "-g",
    "-fsanitize=address,undefined",
    "-fno-omit-frame-pointer",
    "-fno-sanitize-recover=undefined",
]
SANITIZE_SITE = os.path.join("build", "sanitize", "site")


def _sources(patterns):
    return sorted(
        {os.path.relpath(p, ROOT) for pat in patterns for p in glob.glob(os.path.join(ROOT, pat))}
    )


def _shared_libstdcxx():
    """The path of the libstdc++ shared object this process has loaded (torch, imported
    above, needs it), or None where /proc/self/maps does not say."""
    try:
        with open("/proc/self/maps") as maps:
            paths = [line.split()[-1] for line in maps if "/libstdc++.so" in line]
    except OSError:
        return None
    return paths[0] if paths else None


def _extension():
    with_cuda = os.environ.get("DYNEMB_WITH_CUDA", "0") == "1"
    if with_cuda and cpp_extension.CUDA_HOME is None:
        raise RuntimeError("DYNEMB_WITH_CUDA=1 but no CUDA toolkit was found (CUDA_HOME unset)")
    if with_cuda:
        import torch

        if torch.version.cuda is None:
            raise RuntimeError(
                "DYNEMB_WITH_CUDA=1 needs a CUDA build of torch; this one is CPU-only"
            )
    sanitize = os.environ.get("DYNEMB_SANITIZE", "0") == "1"
    if sanitize and with_cuda:
        raise RuntimeError(
            "DYNEMB_SANITIZE=1 builds the CPU extension only: unset DYNEMB_WITH_CUDA"
        )
    cxx_flags = list(CXX_FLAGS)
    shared = _shared_libstdcxx()
    link_flags = [shared if f == "-lstdc++" and shared else f for f in LINK_FLAGS]
    if sanitize:
        cxx_flags = [f for f in cxx_flags if f != "-O3"] + SANITIZE_FLAGS
        link_flags += ["-fsanitize=address,undefined"]
    cuda_sources = _sources(CUDA_SOURCES)
    kwargs = dict(
        name="dynemb._C",
        sources=[p for p in _sources(CPU_SOURCES) if p not in cuda_sources],
        include_dirs=[os.path.join(ROOT, "csrc")],
        extra_compile_args={"cxx": cxx_flags},
        extra_link_args=link_flags,
    )
    if not with_cuda:
        return cpp_extension.CppExtension(**kwargs)
    kwargs["sources"] += cuda_sources
    kwargs["extra_compile_args"]["cxx"] += CUDA_DEFINES
    kwargs["extra_compile_args"]["nvcc"] = NVCC_FLAGS + CUDA_DEFINES
    return cpp_extension.CUDAExtension(**kwargs)


class SanitizedBuildExt(cpp_extension.BuildExtension):
    """build_ext for DYNEMB_SANITIZE=1: objects and the .so under build/sanitize, never in
    place, then the package's Python files beside the .so (a tree PYTHONPATH can point at)."""

    def finalize_options(self):
        super().finalize_options()
        self.inplace = False
        self.build_lib = os.path.join(ROOT, SANITIZE_SITE)
        self.build_temp = os.path.join(ROOT, "build", "sanitize", "temp")

    def run(self):
        super().run()
        site_pkg = os.path.join(ROOT, SANITIZE_SITE, "dynemb")
        for d, _, files in os.walk(site_pkg):  # modules removed from the source go too
            for f in files:
                src = os.path.join(ROOT, "dynemb", os.path.relpath(os.path.join(d, f), site_pkg))
                if f.endswith(".py") and not os.path.exists(src):
                    os.remove(os.path.join(d, f))
        shutil.copytree(
            os.path.join(ROOT, "dynemb"),
            site_pkg,
            ignore=shutil.ignore_patterns("*.so", "__pycache__"),
            dirs_exist_ok=True,
        )


def _build_ext():
    if os.environ.get("DYNEMB_SANITIZE", "0") == "1":
        return SanitizedBuildExt
    return cpp_extension.BuildExtension


setup(
    name="dynemb",
    version="0.1.0",
    description="Dynamic (hash-table) embeddings for TorchRec, on CPU and GPU",
    license="Apache-2.0",
    packages=find_packages(include=["dynemb", "dynemb.*"]),
    ext_modules=[_extension()],
    cmdclass={"build_ext": _build_ext()},
    python_requires=">=3.10",
)
