// dynemb torch layer: the op library `dynemb`: the table and embedding ops (schemas in
// op_schemas.h; implementations registered by ops_cpu.cpp, and ops_cuda.cpp in CUDA
// builds) and host utilities (memory_cpu.cpp, checksum_cpu.cpp, threads_cpu.cpp).
#include <torch/library.h>
#include <torch/extension.h>

#include "torch/core_constants.h"
#include "torch/op_schemas.h"

TORCH_LIBRARY(dynemb, m) {
  DYNEMB_DEFINE_OPS(m);
  m.def("advise_huge_pages(Tensor(a!) buffer) -> bool");
  // CRC-32 (zlib's) of a host byte buffer, continued from crc: checkpoint checks.
  m.def("crc32(Tensor data, int crc) -> int");
}

// Importing dynemb._C loads the library above (and its kernels) into torch.ops.dynemb.
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  dynemb::export_core_constants(m);
  m.attr("with_cuda") =
#ifdef DYNEMB_WITH_CUDA
      true;
#else
      false;
#endif
}
