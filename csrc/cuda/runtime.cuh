// dynemb CUDA executor: the CUDA runtime, real or emulated.
//
// The csrc/cuda sources build twice from the same text: by nvcc for a GPU, and by
// the host compiler with DYNEMB_CUDA_EMULATION defined (csrc/emulated/), where a
// small shim stands in for the runtime: grid and block indices, atomics over
// std::atomic_ref, fences, memset, warp collectives, barriers and shared memory, and
// kernel launches that run blocks on several OS threads, each block's threads in
// lockstep (emulated/lockstep.h). What differs between the two is below; nothing in
// it decides.
//
//   DYNEMB_CUDA_NS            the executor's namespace (dynemb::cuda, or
//                             dynemb::cuda_emulated: both can live in one library)
//   DYNEMB_CUDA_DEVICE_CODE   1 where device atomics exist (device code, emulation)
//   DYNEMB_LAUNCH(grid, block, stream, kernel)(args...)   a kernel launch, checked
//                             (launch_check.h: an empty grid runs nothing; a failure
//                             names the kernel, the op and its table)
//   DYNEMB_SPIN_PAUSE()       inside spin loops (emulated threads share few cores)
//   DYNEMB_VECTOR_LOAD(p, n)  before an n-byte vector load of p: a device faults on a
//                             misaligned one, emulation checks it (cuda_shim.h)
//   load_acquire32(p)         a 32-bit load with acquire order (device scope)
#pragma once

#include "cuda/launch_check.h"

#if defined(DYNEMB_CUDA_EMULATION)
#include "emulated/cuda_shim.h"
#define DYNEMB_CUDA_NS cuda_emulated
#define DYNEMB_CUDA_DEVICE_CODE 1
#define DYNEMB_LAUNCH(grid, block, stream, ...) \
  ::dynemb::emulation::Launch{(grid), (block), (stream), #__VA_ARGS__}.of(__VA_ARGS__)
#define DYNEMB_SPIN_PAUSE() ::dynemb::emulation::spin_pause()
#define DYNEMB_VECTOR_LOAD(p, bytes) \
  ::dynemb::emulation::check_aligned((p), (bytes), "a vector load")
#else
#if defined(__CUDACC__)  // libcu++ (cccl): nvcc's include path only; host .cpp files never use it
#include <cooperative_groups.h>
#include <cuda/atomic>
#endif
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>
#define DYNEMB_CUDA_NS cuda
#if defined(__CUDA_ARCH__)
#define DYNEMB_CUDA_DEVICE_CODE 1
#else
#define DYNEMB_CUDA_DEVICE_CODE 0
#endif
#define DYNEMB_LAUNCH(grid, block, stream, ...) \
  ::dynemb::cuda::Launch{(grid), (block), (stream), #__VA_ARGS__}.of(__VA_ARGS__)
#define DYNEMB_SPIN_PAUSE()
#define DYNEMB_VECTOR_LOAD(p, bytes)
#if defined(__CUDACC__)
namespace dynemb::cuda {
/// One checked launch (launch_check.h): DYNEMB_LAUNCH(grid, block, stream, kernel)(args...).
struct Launch {
  uint64_t grid, block;
  cudaStream_t stream;
  const char* name;  // the kernel's source text
  template <class... P>
  auto of(void (*kernel)(P...)) const {
    return [kernel, l = *this](auto&&... args) {
      if (!check_launch_shape(l.name, l.grid, l.block)) return;
      kernel<<<static_cast<unsigned>(l.grid), static_cast<unsigned>(l.block), 0, l.stream>>>(
          static_cast<decltype(args)&&>(args)...);
      cudaError_t error = cudaGetLastError();
      const bool synced = sync_launches();
      if (error == cudaSuccess && synced) error = cudaStreamSynchronize(l.stream);
      if (error != cudaSuccess) throw_launch_error(l.name, cudaGetErrorString(error), synced);
    };
  }
};
}  // namespace dynemb::cuda
#endif
#if defined(__CUDA_ARCH__)
__device__ inline int32_t load_acquire32(int32_t* p) {
  return cuda::atomic_ref<int32_t, cuda::thread_scope_device>(*p).load(cuda::memory_order_acquire);
}
#endif
#endif
