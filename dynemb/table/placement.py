"""Where each buffer of a table lives: one function of (device, spilled).

A table is nine buffers (csrc/torch/tensor_checks.h). On a GPU, DynamicEmb keeps
the key metadata (digests, keys, scores) and the fast rows in device memory and
the slow tier in host memory; dynemb does the same, and its kernels address the
host rows directly (page-locked, mapped under unified addressing: no staging
copies). The op checks accept exactly these placements.

=============  =========================  ===========================
buffer         CPU (spilled: file)        GPU (spilled: file)
=============  =========================  ===========================
digests        device (file)              device (device)
keys           device (file)              device (device)
scores         device (file)              device (device)
timestamps     device (file)              device (device)
values         device                     device
locks          device                     device
overflow       device (file)              device (device)
slow_values    device (file)              host (file)
pins           device                     device
=============  =========================  ===========================

"device" is host RAM on a CPU. A spilled GPU table keeps its metadata in device
memory (the kernels probe it every lookup) and writes it to the spill files when
flushed, as a spilled table does with its fast-tier rows. The emulated CUDA
executor (``DYNEMB_EXECUTOR=cuda-emulated``) gets the GPU layout over host
memory, so the tests run the GPU's tier code paths.

Caching mode: the cache is a table whose rows are all in device memory; its
built-in slow tier (``backing_fast_rows``) keeps every row in host memory on a GPU.
"""

import dataclasses
import enum

import torch

from dynemb import _ops

BUFFERS = (
    "digests",
    "keys",
    "scores",
    "timestamps",
    "values",
    "locks",
    "overflow",
    "slow_values",
    "pins",
)


# Buffers that hold no table content (locks; the pins of batches in flight): a
# spilled table neither writes nor reads them from its files.
_TRANSIENT = ("locks", "pins")


class Memory(enum.Enum):
    DEVICE = "device"  # the table's device: HBM on a GPU, RAM on a CPU
    HOST = "host"  # RAM the GPU's kernels address directly (page-locked, mapped)
    FILE = "file"  # a shared file mapping (on a GPU: page-locked and mapped too)


@dataclasses.dataclass(frozen=True)
class TablePlacement:
    """The memory of each buffer of one table (``memory[name]`` for name in BUFFERS).

    Attributes:
        device: the table's device.
        gpu_layout: the GPU placement (a CUDA device, or the emulated CUDA executor).
        memory: buffer name -> Memory.
    """

    device: torch.device
    gpu_layout: bool
    memory: dict

    @property
    def registers_host_memory(self) -> bool:
        """Whether HOST and FILE buffers must be page-locked for the device (real CUDA)."""
        return self.device.type == "cuda"

    def resident_spill_buffers(self) -> tuple[str, ...]:
        """Buffers a spilled table keeps in memory and writes to its files on flush."""
        return tuple(
            name
            for name in BUFFERS
            if name not in _TRANSIENT and self.memory[name] is Memory.DEVICE
        )


def uses_gpu_layout(device: torch.device) -> bool:
    return device.type == "cuda" or _ops.executor() == "cuda-emulated"


def canonical_device(device: str | torch.device) -> torch.device:
    """``device`` as its tensors report it: ``"cuda"`` becomes ``cuda:<current device>``.

    A tensor made on ``"cuda"`` reports ``cuda:0`` (the current device), and
    ``torch.device("cuda") != torch.device("cuda:0")``: a table that kept the bare
    name would refuse its own keys. Other devices are returned unchanged.
    """
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device


def table_placement(device: str | torch.device, spilled: bool) -> TablePlacement:
    """The placement of a table on ``device`` (spilled: its slot buffers in files).

    Example::

        p = table_placement("cuda:0", spilled=False)
        p.memory["slow_values"]  # Memory.HOST
    """
    device = torch.device(device)
    gpu = uses_gpu_layout(device)
    memory = dict.fromkeys(BUFFERS, Memory.DEVICE)
    if gpu:
        memory["slow_values"] = Memory.FILE if spilled else Memory.HOST
    elif spilled:
        for name in ("digests", "keys", "scores", "timestamps", "overflow", "slow_values"):
            memory[name] = Memory.FILE
    return TablePlacement(device=device, gpu_layout=gpu, memory=memory)


def backing_fast_rows(device: str | torch.device) -> int | None:
    """``fast_rows`` of a cached table's built-in slow tier: on a GPU every row in host
    memory (0), on a CPU where the table puts them (None: one tier, host RAM)."""
    return 0 if uses_gpu_layout(torch.device(device)) else None


__all__ = [
    "BUFFERS",
    "Memory",
    "TablePlacement",
    "backing_fast_rows",
    "canonical_device",
    "table_placement",
    "uses_gpu_layout",
]
