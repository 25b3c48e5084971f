"""Builds dynemb._C: the CPU and emulated CUDA executors always; the CUDA executor with
DYNEMB_WITH_CUDA=1.

The CUDA sources (csrc/cuda/*.cu) are torch-free launchers; csrc/torch/*_cuda.cpp
registers them with the dispatcher and is compiled only for a CUDA build of torch.
"""

import glob
import os

from setuptools import find_packages, setup
from torch.utils import cpp_extension

ROOT = os.path.dirname(os.path.abspath(__file__))


def _sources(pattern):
    return sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, pattern)))


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
    # -ffp-contract=off: no fused multiply-add contraction, so every code path (and the
    # reference formulas in tests) rounds the same way.
    cxx = [
        "-O3",
        "-std=c++20",
        "-fopenmp",
        "-march=native",
        "-ffp-contract=off",
        "-Wall",
        "-Wno-unused-function",
        "-Wno-unknown-pragmas",
    ]
    # csrc/emulated: the CUDA executor's sources built for the host (the emulated
    # executor, DYNEMB_EXECUTOR=cuda-emulated), in every build.
    sources = (
        _sources("csrc/cpu/*.cpp")
        + [p for p in _sources("csrc/torch/*.cpp") if not p.endswith("_cuda.cpp")]
        + _sources("csrc/emulated/*.cpp")
    )
    kwargs = dict(
        name="dynemb._C",
        sources=sources,
        include_dirs=[os.path.join(ROOT, "csrc")],
        extra_compile_args={"cxx": cxx},
        extra_link_args=["-fopenmp"],
    )
    if not with_cuda:
        return cpp_extension.CppExtension(**kwargs)
    kwargs["sources"] += _sources("csrc/cuda/*.cu") + _sources("csrc/torch/*_cuda.cpp")
    kwargs["extra_compile_args"]["cxx"].append("-DDYNEMB_WITH_CUDA")
    # --fmad=false: no fused multiply-add contraction, as -ffp-contract=off for the host.
    kwargs["extra_compile_args"]["nvcc"] = ["-O3", "-std=c++20", "--fmad=false", "-DDYNEMB_WITH_CUDA"]
    return cpp_extension.CUDAExtension(**kwargs)


setup(
    name="dynemb",
    version="0.1.0",
    description="Dynamic (hash-table) embeddings for TorchRec, on CPU and GPU",
    license="Apache-2.0",
    packages=find_packages(include=["dynemb", "dynemb.*"]),
    ext_modules=[_extension()],
    cmdclass={"build_ext": cpp_extension.BuildExtension},
    python_requires=">=3.10",
)
