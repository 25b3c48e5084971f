// dynemb CUDA executor: launch geometry and the generic per-key upsert kernel,
// shared by the .cu files (torch-free).
#pragma once

#include "core/table_ops.h"
#include "cuda/cuda_platform.cuh"

namespace dynemb::cuda {

constexpr int kBlock = 256;

inline unsigned blocks_for(int64_t n) {
  return static_cast<unsigned>((n + kBlock - 1) / kBlock);
}

__device__ inline int64_t thread_index() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}

/// One thread per key: core upsert with any Sink; status and per-Status counts out.
template <class V, class Sink>
__global__ void upsert_kernel(TableRef<V> t, Sink sink, UpsertArgs args, const int64_t* keys,
                              int64_t n, int8_t* status, unsigned long long* counts) {
  const int64_t i = thread_index();
  if (i >= n) return;
  const Status s = upsert<CudaPlatform>(t, i, i, keys[i], args, sink);
  status[i] = static_cast<int8_t>(s);
  atomicAdd(counts + static_cast<int>(s), 1ULL);
}

/// Zeroes counts (4) and launches upsert_kernel over n keys.
template <class V, class Sink>
void launch_upsert(const Sink& sink, const UpsertArgs& args, const int64_t* keys, int64_t n,
                   int8_t* status, int64_t* counts, cudaStream_t stream) {
  cudaMemsetAsync(counts, 0, 4 * sizeof(int64_t), stream);
  if (n == 0) return;
  upsert_kernel<V, Sink><<<blocks_for(n), kBlock, 0, stream>>>(
      sink.t, sink, args, keys, n, status, reinterpret_cast<unsigned long long*>(counts));
}

}  // namespace dynemb::cuda
