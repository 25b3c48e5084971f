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

/// Pass 1 of a hits-first batch (core touch_stored): status kHit for stored keys,
/// -1 for the others.
template <class V, class Sink>
__global__ void touch_kernel(TableRef<V> t, Sink sink, UpsertArgs args, const int64_t* keys,
                             int64_t n, int8_t* status) {
  const int64_t i = thread_index();
  if (i >= n) return;
  const bool hit = touch_stored<CudaPlatform>(t, i, i, keys[i], args, sink);
  status[i] = hit ? static_cast<int8_t>(Status::kHit) : int8_t{-1};
}

/// One thread per key: core upsert with any Sink; status and per-Status counts out.
/// With hits_first, keys touch_kernel found are only counted.
template <class V, class Sink>
__global__ void upsert_kernel(TableRef<V> t, Sink sink, UpsertArgs args, const int64_t* keys,
                              int64_t n, int8_t* status, unsigned long long* counts) {
  const int64_t i = thread_index();
  if (i >= n) return;
  Status s = Status::kHit;
  if (!args.hits_first || status[i] != static_cast<int8_t>(Status::kHit)) {
    s = upsert<CudaPlatform>(t, i, i, keys[i], args, sink);
  }
  status[i] = static_cast<int8_t>(s);
  atomicAdd(counts + static_cast<int>(s), 1ULL);
}

/// Zeroes counts (4) and launches upsert_kernel over n keys (after touch_kernel
/// with hits_first: the kernel boundary orders the two passes).
template <class V, class Sink>
void launch_upsert(const Sink& sink, const UpsertArgs& args, const int64_t* keys, int64_t n,
                   int8_t* status, int64_t* counts, cudaStream_t stream) {
  cudaMemsetAsync(counts, 0, 4 * sizeof(int64_t), stream);
  if (n == 0) return;
  if (args.hits_first) {
    touch_kernel<V, Sink><<<blocks_for(n), kBlock, 0, stream>>>(sink.t, sink, args, keys, n,
                                                                status);
  }
  upsert_kernel<V, Sink><<<blocks_for(n), kBlock, 0, stream>>>(
      sink.t, sink, args, keys, n, status, reinterpret_cast<unsigned long long*>(counts));
}

}  // namespace dynemb::cuda
