// dynemb emulated CUDA executor: a host stand-in for the CUDA runtime, so that the
// csrc/cuda sources build with the host compiler and run on CPU threads.
//
// Kernels run on a small pool of OS threads (launch.cpp): each takes warps (32
// consecutive threads of a block) from a shared counter and runs their threads one
// after another, so keys of one batch really race between OS threads, as blocks
// do on a GPU. Supported: everything the dynemb kernels use (1-D grids, global
// memory atomics, fences, memset); not __syncthreads or shared memory, which no
// dynemb kernel uses. Launches are synchronous: a launch returns when its grid has
// run, which keeps the stream order of the real device. What emulation cannot
// show: the GPU memory model, warp scheduling, speed.
#pragma once

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <functional>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline

/// A 1-D stand-in for CUDA's dim3 (the y and z extents are always 1 here).
struct dim3 {
  unsigned x, y, z;
  dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};

extern thread_local dim3 blockIdx;
extern thread_local dim3 threadIdx;
extern thread_local dim3 blockDim;
extern thread_local dim3 gridDim;

struct CUstream_st;
using cudaStream_t = CUstream_st*;
enum cudaError_t { cudaSuccess = 0 };

/// The storage types of float16 / bfloat16 rows: torch's, bit-identical to CUDA's.
using __half = c10::Half;
using __nv_bfloat16 = c10::BFloat16;

inline cudaError_t cudaMemsetAsync(void* p, int value, size_t bytes, cudaStream_t) {
  std::memset(p, value, bytes);
  return cudaSuccess;
}

template <class T>
T atomicAdd(T* p, T v) {
  return std::atomic_ref<T>(*p).fetch_add(v, std::memory_order_relaxed);
}
template <class T>
T atomicCAS(T* p, T expected, T desired) {
  std::atomic_ref<T>(*p).compare_exchange_strong(expected, desired, std::memory_order_acq_rel);
  return expected;
}
template <class T>
T atomicExch(T* p, T v) {
  return std::atomic_ref<T>(*p).exchange(v, std::memory_order_acq_rel);
}
template <class T>
T atomicMax(T* p, T v) {
  std::atomic_ref<T> a(*p);
  T old = a.load(std::memory_order_relaxed);
  while (old < v && !a.compare_exchange_weak(old, v, std::memory_order_acq_rel)) {
  }
  return old;
}
inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
/// cuda/runtime.cuh's load_acquire32 (cuda::atomic_ref's acquire load on a device).
inline int32_t load_acquire32(int32_t* p) {
  return std::atomic_ref<int32_t>(*p).load(std::memory_order_acquire);
}

namespace dynemb::emulation {

/// Runs thread(t) for every thread t of a grid of grid x block threads, warps on a
/// pool of OS threads (blockIdx / threadIdx set for each). Returns when all ran.
void run_grid(unsigned grid, unsigned block, const std::function<void()>& thread);

/// Yields the OS thread (called in spin loops: the lock holder may be descheduled).
void spin_pause();

/// DYNEMB_LAUNCH(grid, block, stream, kernel)(args...) in emulation.
struct Launch {
  unsigned grid;
  unsigned block;
  cudaStream_t stream;
  template <class Kernel>
  auto of(Kernel* kernel) const {
    const unsigned g = grid, b = block;
    return [kernel, g, b](auto... args) { run_grid(g, b, [&] { kernel(args...); }); };
  }
};

}  // namespace dynemb::emulation
