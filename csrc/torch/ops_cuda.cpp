// dynemb torch layer: CUDA registration of the ops declared in ops.cpp.
// Compiled only when DYNEMB_WITH_CUDA=1 with a CUDA build of torch (setup.py) and by
// `make cuda-check`, which compiles and links it in CI; it runs only on a GPU. The
// Backend is cuda_backend.h; this file gives it the current stream and device guard.
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include "torch/cuda_backend.h"

namespace dynemb {
namespace {

struct CudaRuntime {
  static cudaStream_t stream() { return c10::cuda::getCurrentCUDAStream().stream(); }
  using DeviceGuard = c10::cuda::CUDAGuard;
};

}  // namespace

TORCH_LIBRARY_IMPL(dynemb, CUDA, m) {
  DYNEMB_REGISTER_TABLE_OPS(m, CudaBackend<CudaRuntime>);
  DYNEMB_REGISTER_EMBEDDING_OPS(m, CudaBackend<CudaRuntime>);
}

}  // namespace dynemb
