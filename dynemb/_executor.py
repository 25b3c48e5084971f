"""Which executor runs dynemb's table and embedding ops (``DYNEMB_EXECUTOR``, read
once, at import; see dynemb/_ops.py), and the op library that serves it."""

import os

import torch

import dynemb._C as _C  # loads the op libraries into torch.ops

EXECUTORS = ("cpu", "cuda", "cuda-emulated")


def _selected_executor() -> str | None:
    """The executor DYNEMB_EXECUTOR names, or None when it is unset or empty."""
    name = os.environ.get("DYNEMB_EXECUTOR", "").strip()
    if not name:
        return None
    if name not in EXECUTORS:
        raise ValueError(
            f"DYNEMB_EXECUTOR={name!r} is not an executor; expected one of {', '.join(EXECUTORS)}"
        )
    if name == "cuda" and not _C.with_cuda:
        raise ValueError(
            "DYNEMB_EXECUTOR='cuda' but dynemb was built without CUDA "
            "(rebuild with DYNEMB_WITH_CUDA=1 against a CUDA build of torch)"
        )
    return name


_EXECUTOR = _selected_executor()
# Table and embedding ops; host utilities (crc32, huge pages, threads) stay in torch.ops.dynemb.
_dynemb = torch.ops.dynemb_cuda_emulated if _EXECUTOR == "cuda-emulated" else torch.ops.dynemb
_host = torch.ops.dynemb


def executor() -> str:
    """Names the executor that runs dynemb's ops: ``"cpu"``, ``"cuda"`` or ``"cuda-emulated"``.

    ``cuda-emulated`` when ``DYNEMB_EXECUTOR`` selects it; otherwise ``"cuda"`` when
    dynemb was built with CUDA and a GPU is present (tensors on it run the CUDA
    executor; CPU tensors still run the CPU one), else ``"cpu"``.
    """
    if _EXECUTOR is not None:
        return _EXECUTOR
    return "cuda" if _C.with_cuda and torch.cuda.is_available() else "cpu"


def emulation_counters() -> dict[str, int]:
    """What the emulated CUDA executor ran since the process started: ``launches``
    (kernels), ``memsets``, ``blocks`` and ``threads``: what the same ops launch on a
    GPU, and ``host_reads``: how often they read device values back (each a wait for
    the stream on a GPU). Counts only ops run with ``DYNEMB_EXECUTOR=cuda-emulated``."""
    names = ("launches", "memsets", "blocks", "threads", "host_reads")
    return dict(zip(names, torch.ops.dynemb_cuda_emulated.emulation_counters(), strict=True))


# The order of emulation_accesses' counts (csrc/emulated/ops_emulated.cpp).
_ACCESS_NAMES = tuple(
    f"{what}_{part}_{kind}"
    for what in ("bytes", "lines")
    for part in ("meta", "row")
    for kind in ("read", "written")
) + ("lines_meta", "lines_row")


def emulation_count_accesses(on: bool) -> None:
    """Turns on (or off) the emulated executor's count of table accesses, emptied either
    way: every metadata and row access of the table core (csrc/core/access_count.h)."""
    torch.ops.dynemb_cuda_emulated.emulation_count_accesses(on)


def emulation_accesses(reset: bool = True) -> dict[str, int]:
    """The distinct table bytes and 64-byte lines the emulated executor's ops accessed
    since the count was turned on or last reset (``reset``: empty it now):
    ``bytes_meta_read``, ``bytes_meta_written``, ``bytes_row_read``, ``bytes_row_written``
    and the same four for ``lines_``, then ``lines_meta`` and ``lines_row``: the lines read
    or written. Metadata: digests, keys, scores, timestamps, pins,
    overflow flags and bucket locks."""
    counts = torch.ops.dynemb_cuda_emulated.emulation_accesses(reset)
    return dict(zip(_ACCESS_NAMES, counts, strict=True))
