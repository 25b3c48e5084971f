"""Helpers of `make cuda-check` (mk/cuda-check.mk); plain Python, no torch import needed.

    cuda_check.py fetch CACHE   download the CUDA wheel of torch once, keep what the build needs
    cuda_check.py flags CACHE   print the make variables that compile and link the CUDA build

`fetch` downloads torch TORCH_VERSION (PyPI's default Linux wheel is the +cu130 build) into
a temporary folder beside CACHE, checks it is the CUDA build, extracts torch/include/**,
the libraries the extension links against and two small .py files, then renames the
folder to CACHE: an interrupted run leaves no half-filled CACHE behind.

`flags` rebuilds the compiler and linker command lines that `DYNEMB_WITH_CUDA=1 pip install
--no-build-isolation -e .` runs: dynemb's flags and source patterns are read from setup.py's
literal lists, torch's own nvcc flags from that torch's torch/utils/cpp_extension.py, and
Python's from sysconfig, the way torch.utils.cpp_extension.BuildExtension assembles them.
"""

import ast
import glob
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import time
import zipfile

TORCH_VERSION = "2.13.0"
TORCH_CUDA = "cu130"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# What the link needs: CUDAExtension links exactly these (torch.utils.cpp_extension).
TORCH_LIBS = ["c10", "torch", "torch_cpu", "torch_python", "c10_cuda", "torch_cuda"]
KEEP_FILES = {f"torch/lib/lib{name}.so" for name in TORCH_LIBS} | {
    "torch/version.py",
    "torch/utils/cpp_extension.py",
}
COMPLETE = ".complete"


def _fail(msg):
    sys.exit(f"cuda-check: {msg}")


def _wanted(name):
    return name in KEEP_FILES or (name.startswith("torch/include/") and not name.endswith("/"))


def _check_version(version_py):
    text = version_py if isinstance(version_py, str) else version_py.decode()
    expected = f"{TORCH_VERSION}+{TORCH_CUDA}"
    if f"__version__ = '{expected}'" not in text:
        found = re.search(r"__version__ = '([^']*)'", text)
        _fail(f"downloaded torch {found.group(1) if found else '?'}, expected {expected}")


def fetch(cache):
    if os.path.exists(os.path.join(cache, COMPLETE)):
        return
    # An incomplete cache is replaced, but never a folder that holds anything else.
    if os.path.exists(cache) and not set(os.listdir(cache)) <= {"torch"}:
        _fail(f"{cache} exists and is no torch cache: remove it or set TORCH_CUDA_CACHE")
    parent = os.path.dirname(os.path.abspath(cache))
    os.makedirs(parent, exist_ok=True)
    # What a killed fetch left behind (a running one touches its folder within minutes).
    for old in glob.glob(os.path.join(parent, os.path.basename(cache) + ".partial-*")):
        if time.time() - os.path.getmtime(old) > 3600:
            shutil.rmtree(old, ignore_errors=True)
    tmp = tempfile.mkdtemp(prefix=os.path.basename(cache) + ".partial-", dir=parent)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # clean up when killed, too
    try:
        wheel_dir = os.path.join(tmp, "wheel")
        # --isolated: ignore the machine's pip config, whose local wheels and index prefer
        # the CPU build of the same version. PIP_CERT (a config item) is passed on.
        cmd = [sys.executable, "-m", "pip", "download", "--isolated", "--no-deps"]
        cmd += ["--only-binary=:all:", "--no-cache-dir", "--disable-pip-version-check"]
        cmd += ["--progress-bar=off"]
        if os.environ.get("PIP_CERT"):
            cmd += ["--cert", os.environ["PIP_CERT"]]
        cmd += ["-d", wheel_dir, f"torch=={TORCH_VERSION}"]
        print("cuda-check: downloading the CUDA build of torch:", shlex.join(cmd), flush=True)
        subprocess.run(cmd, check=True)
        wheels = glob.glob(os.path.join(wheel_dir, "torch-*.whl"))
        if len(wheels) != 1:
            _fail(f"expected one torch wheel in {wheel_dir}, found {wheels}")
        with zipfile.ZipFile(wheels[0]) as whl:
            _check_version(whl.read("torch/version.py"))
            members = [n for n in whl.namelist() if _wanted(n)]
            missing = KEEP_FILES - set(members)
            if missing:
                _fail(f"{os.path.basename(wheels[0])} lacks {sorted(missing)}")
            print(f"cuda-check: extracting {len(members)} files into {cache}", flush=True)
            for name in members:
                whl.extract(name, tmp)
        shutil.rmtree(wheel_dir)
        with open(os.path.join(tmp, COMPLETE), "w") as f:
            f.write(f"torch {TORCH_VERSION}+{TORCH_CUDA} from {os.path.basename(wheels[0])}\n")
        if os.path.exists(cache):
            shutil.rmtree(cache)
        os.chmod(tmp, 0o755)  # mkdtemp made it private
        os.rename(tmp, cache)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _literals(path, names):
    """The values of the top-level `NAME = <literal>` assignments of a Python file."""
    with open(path) as f:
        tree = ast.parse(f.read(), path)
    values = {}
    for node in tree.body:
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name) and target.id in names:
                    values[target.id] = ast.literal_eval(node.value)
    missing = [n for n in names if n not in values]
    if missing:
        _fail(f"{path} defines no literal {', '.join(missing)}")
    return values


def _nvcc_cuda_version(nvcc):
    out = subprocess.run([nvcc, "--version"], check=True, capture_output=True, text=True).stdout
    found = re.search(r"release (\d+)\.(\d+)", out)
    if not found:
        _fail(f"cannot read the CUDA version from `{nvcc} --version`")
    return found.group(1), found.group(2)


def flags(cache, nvcc, cuda_home, archs):
    torch_dir = os.path.join(cache, "torch")
    missing = [f for f in sorted(KEEP_FILES) if not os.path.exists(os.path.join(cache, f))]
    if missing:
        _fail(f"{cache} lacks {missing} (an older layout?): remove it and run again")
    setup = _literals(
        os.path.join(ROOT, "setup.py"),
        ["CPU_SOURCES", "CUDA_SOURCES", "CXX_FLAGS", "NVCC_FLAGS", "CUDA_DEFINES", "LINK_FLAGS"],
    )
    torch_ext = _literals(
        os.path.join(torch_dir, "utils", "cpp_extension.py"), ["COMMON_NVCC_FLAGS"]
    )
    with open(os.path.join(torch_dir, "version.py")) as f:
        torch_cuda = re.search(r"cuda: Optional\[str\] = '(\d+)\.(\d+)'", f.read())
    if torch_cuda is None:
        _fail(f"{torch_dir}/version.py names no CUDA version")
    nvcc_version = _nvcc_cuda_version(nvcc)
    # BuildExtension refuses a toolkit whose major version differs from torch's.
    if nvcc_version[0] != torch_cuda.group(1):
        _fail(
            f"nvcc is CUDA {'.'.join(nvcc_version)}, torch is built with CUDA "
            f"{torch_cuda.group(1)}.{torch_cuda.group(2)}"
        )
    for needed in ("include/cuda_runtime.h", "lib64/libcudart.so"):
        if not os.path.exists(os.path.join(cuda_home, needed)):
            _fail(f"{cuda_home}/{needed} not found: set CUDA_HOME to the CUDA toolkit")

    py_include = sysconfig.get_paths()["include"]
    includes = [
        os.path.join(ROOT, "csrc"),
        os.path.join(torch_dir, "include"),
        os.path.join(torch_dir, "include", "torch", "csrc", "api", "include"),
        os.path.join(cuda_home, "include"),
        py_include,
    ]
    inc = [f"-I{d}" for d in includes]
    ext = ["-DTORCH_API_INCLUDE_EXTENSION_H", "-DTORCH_EXTENSION_NAME=_C"]
    # setuptools' compiler: Python's CFLAGS and CCSHARED (-fPIC) come first.
    py_cflags = shlex.split(sysconfig.get_config_var("CFLAGS") or "")
    py_cflags += shlex.split(sysconfig.get_config_var("CCSHARED") or "")
    cxx = py_cflags + inc + setup["CXX_FLAGS"] + setup["CUDA_DEFINES"] + ext
    gencode = [f"-gencode=arch=compute_{a},code=sm_{a}" for a in archs]
    nvcc_flags = inc + setup["NVCC_FLAGS"] + setup["CUDA_DEFINES"] + ext
    nvcc_flags = torch_ext["COMMON_NVCC_FLAGS"] + ["-Xcompiler", "-fPIC"] + nvcc_flags + gencode
    lib_dirs = [os.path.join(torch_dir, "lib"), os.path.join(cuda_home, "lib64")]
    libs = ["c10", "torch", "torch_cpu", "torch_python", "cudart", "c10_cuda", "torch_cuda"]
    if sysconfig.get_config_var("Py_ENABLE_SHARED"):  # setuptools adds Python's LIBDIR
        lib_dirs.append(sysconfig.get_config_var("LIBDIR"))
    ld = ["-shared"] + [f"-L{d}" for d in lib_dirs] + [f"-l{x}" for x in libs]
    ld += setup["LINK_FLAGS"]
    # The extension leaves Python's C API to the interpreter that loads it; a check link
    # with --no-undefined needs libpython to resolve it (only where Python is shared).
    pylib = []
    if sysconfig.get_config_var("Py_ENABLE_SHARED"):
        pylib = [f"-lpython{sysconfig.get_config_var('LDVERSION')}"]

    def var(name, values, quote=shlex.quote):
        print(f"{name} := {' '.join(quote(v) for v in values)}")

    var("CUDA_CHECK_SOURCE_PATTERNS", setup["CPU_SOURCES"] + setup["CUDA_SOURCES"], str)
    var("CUDA_CHECK_CXXFLAGS", cxx)
    var("CUDA_CHECK_NVCCFLAGS", nvcc_flags)
    var("CUDA_CHECK_LDFLAGS", shlex.split(sysconfig.get_config_var("CFLAGS") or "") + ld)
    var("CUDA_CHECK_PYLIB", pylib)


def main(argv):
    if len(argv) >= 2 and argv[0] == "fetch":
        fetch(argv[1])
    elif len(argv) >= 4 and argv[0] == "flags":
        flags(argv[1], argv[2], argv[3], argv[4:])
    else:
        _fail(f"usage: {sys.argv[0]} fetch CACHE | flags CACHE NVCC CUDA_HOME ARCH...")


if __name__ == "__main__":
    main(sys.argv[1:])
