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
  /// Page-locked (torch's caching host allocator keeps it until the copy has run).
  static at::Tensor host_bytes(int64_t n) {
    return at::empty({n}, at::TensorOptions().dtype(at::kByte).pinned_memory(true));
  }
  static at::Tensor to_device(const at::Tensor& host, at::Device device) {
    return host.to(device, /*non_blocking=*/true);
  }
  static at::Tensor to_host(const at::Tensor& device) { return device.cpu(); }  // waits
};

}  // namespace

TORCH_LIBRARY_IMPL(dynemb, CUDA, m) {
  DYNEMB_REGISTER_TABLE_OPS(m, CudaBackend<CudaRuntime>);
  DYNEMB_REGISTER_EMBEDDING_OPS(m, CudaBackend<CudaRuntime>);
  DYNEMB_REGISTER_QUANTIZED_OPS(m, CudaBackend<CudaRuntime>);
  DYNEMB_REGISTER_SLOT_OPS(m, CudaBackend<CudaRuntime>);
}

}  // namespace dynemb
