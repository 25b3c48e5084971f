"""Host memory that a GPU's kernels address directly.

A GPU table's slow tier is ordinary host memory (anonymous, or a spill file's
mapping) page-locked and mapped with ``cudaHostRegister``: under unified addressing
its host pointer is valid in kernels, so they read and write the rows over the bus
with no staging copies. Registering our own buffer, not allocating with
``pin_memory=True``, keeps huge pages and file mappings, and avoids torch's pinned
allocator rounding every block up to a power of two (a 10 GiB tier would take 16).
"""

import torch

_REGISTER_PORTABLE = 1  # cudaHostRegisterPortable: valid on every device
_REGISTER_MAPPED = 2  # cudaHostRegisterMapped: addressable from kernels


class PageLock:
    """Keeps ``tensor``'s memory page-locked and device-mapped until ``release()`` or
    garbage collection; holds the tensor, so the memory outlives the registration.

    Args:
        tensor: a contiguous CPU tensor (an empty one is left alone).

    Raises:
        RuntimeError: CUDA refused (e.g. the page-locked memory limit), naming the size.
    """

    def __init__(self, tensor: torch.Tensor) -> None:
        if tensor.device.type != "cpu" or not tensor.is_contiguous():
            raise ValueError(f"PageLock needs a contiguous CPU tensor, got {tensor.device}")
        self.tensor = tensor
        self._ptr = None
        nbytes = tensor.numel() * tensor.element_size()
        if nbytes == 0:
            return
        error = torch.cuda.cudart().cudaHostRegister(
            tensor.data_ptr(), nbytes, _REGISTER_PORTABLE | _REGISTER_MAPPED
        )
        if int(error) != 0:
            raise RuntimeError(
                f"cudaHostRegister of {nbytes} bytes of host memory failed ({error}); "
                "the slow tier of a GPU table must be page-locked (check `ulimit -l`)"
            )
        self._ptr = tensor.data_ptr()

    def release(self) -> None:
        if self._ptr is not None:
            torch.cuda.synchronize()  # no kernel in flight may still address it
            torch.cuda.cudart().cudaHostUnregister(self._ptr)
            self._ptr = None

    def __del__(self) -> None:
        self.release()
