"""Which devices the tests run on, and which process-group backend multi-process tests use.

One switch, the environment variable ``DYNEMB_TEST_CUDA`` (``make gpu-test`` sets it to 1):

- unset: ``cpu``, plus ``cuda`` when dynemb is built with CUDA and a GPU is present;
- ``1``: ``cpu`` and ``cuda``, and an error when either is missing, so that a GPU run
  can never pass on the CPU alone;
- ``0``: ``cpu`` only.

Device-parametrised tests take the ``device`` fixture of ``tests/conftest.py``, which
reads ``test_devices()``. Multi-process tests (``tests/support/multiprocess.py``) ask
``process_group_backend`` which backend their ranks use.
"""

import os

import dynemb._C as _C
import torch

SWITCH = "DYNEMB_TEST_CUDA"


def cuda_ready() -> bool:
    """True when dynemb is built with CUDA and torch sees a GPU."""
    return bool(_C.with_cuda) and torch.cuda.is_available()


def test_devices() -> list[str]:
    """The device types that device-parametrised tests run on (see the module doc).

    Raises:
        RuntimeError: ``DYNEMB_TEST_CUDA=1`` but dynemb has no CUDA executor or torch
            sees no GPU; or the variable holds another value than ``0`` / ``1``.
    """
    value = os.environ.get(SWITCH, "").strip()
    if value not in ("", "0", "1"):
        raise RuntimeError(f"{SWITCH} must be 0, 1 or unset, got {value!r}")
    if value == "0":
        return ["cpu"]
    if value == "1" and not cuda_ready():
        why = "dynemb is built without CUDA" if not _C.with_cuda else "torch sees no GPU"
        raise RuntimeError(
            f"{SWITCH}=1 asks for the cuda test device, but {why} "
            "(`make gpu-test` builds with DYNEMB_WITH_CUDA=1 on a GPU machine)"
        )
    return ["cpu", "cuda"] if cuda_ready() else ["cpu"]


test_devices.__test__ = False  # a helper, not a pytest test


def process_group_backend(world_size: int, device: str = "cpu") -> str:
    """The backend of a ``world_size``-rank process group whose ranks use ``device``.

    ``nccl`` when the ranks' tensors are on ``cuda``, the cuda test device is on and
    every rank has a GPU of its own; ``gloo`` otherwise (ranks on CPU tensors, or
    fewer GPUs than ranks).

    Args:
        world_size: number of ranks (>= 1).
        device: device type the ranks' tensors live on, ``"cpu"`` or ``"cuda"``.

    Returns:
        ``"nccl"`` or ``"gloo"``.
    """
    if device == "cuda" and "cuda" in test_devices() and torch.cuda.device_count() >= world_size:
        return "nccl"
    return "gloo"
