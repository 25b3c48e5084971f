// dynemb CUDA executor: embedding kernels over the core maths (core/pooling.h,
// core/optimizer_rules.h). Launch geometry and atomics only.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cuda/cuda_platform.cuh"
#include "cuda/launchers_cuda.h"

namespace dynemb::cuda {
namespace {

using P = CudaPlatform;
constexpr int kBlock = 256;

unsigned blocks_for(int64_t n) { return static_cast<unsigned>((n + kBlock - 1) / kBlock); }

__device__ int64_t thread_index() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}

template <class V>
__global__ void slots_kernel(SlotSink<V> sink, UpsertArgs args, const int64_t* keys, int64_t n,
                             int8_t* status, unsigned long long* counts) {
  const int64_t i = thread_index();
  if (i >= n) return;
  const Status s = upsert<P>(sink.t, i, keys[i], args, sink);
  status[i] = static_cast<int8_t>(s);
  atomicAdd(counts + static_cast<int>(s), 1ULL);
}

template <class V>
__global__ void pool_kernel(TableRef<V> t, const int64_t* slots, const int64_t* keys,
                            const int64_t* offsets, int64_t num_bags, const float* weights,
                            PoolingMode mode, InitArgs missing, float* out, int64_t dim) {
  const int64_t b = thread_index();
  if (b >= num_bags) return;
  pool_bag(t, slots, keys, weights, offsets[b], offsets[b + 1], mode, missing, out + b * dim, dim);
}

template <class V>
__global__ void gather_kernel(TableRef<V> t, const int64_t* slots, const int64_t* keys, int64_t n,
                              InitArgs missing, float* out, int64_t dim) {
  const int64_t i = thread_index();
  if (i < n) gather_row(t, slots, keys, i, missing, out + i * dim, dim);
}

// Gives every distinct slot a dense id: the first thread to see a slot claims it
// (-1 -> -2), takes an id and publishes it; the others wait for the id.
__global__ void assign_uid_kernel(const int64_t* slots, int64_t n, BackwardScratch s) {
  const int64_t i = thread_index();
  if (i >= n) return;
  const int64_t slot = slots[i];
  if (slot < 0) {
    s.uid[i] = -1;
    return;
  }
  int32_t* cell = s.uid_of_slot + slot;
  if (atomicCAS(cell, -1, -2) == -1) {
    const int32_t u = atomicAdd(s.num_unique, 1);
    s.unique_slots[u] = slot;
    __threadfence();
    atomicExch(cell, u);
    s.uid[i] = u;
  } else {
    int32_t u;
    while ((u = atomicAdd(cell, 0)) == -2) {
    }
    s.uid[i] = u;
  }
}

__global__ void accumulate_kernel(const int64_t* offsets, int64_t num_bags, const float* weights,
                                  PoolingMode mode, const float* grad, int64_t dim,
                                  BackwardScratch s) {
  const int64_t b = thread_index();
  if (b >= num_bags) return;
  const int64_t begin = offsets[b], end = offsets[b + 1];
  for (int64_t i = begin; i < end; ++i) {
    if (s.uid[i] < 0) continue;
    const float c = grad_scale(mode, weights, i, begin, end);
    float* a = s.acc + static_cast<int64_t>(s.uid[i]) * dim;
    for (int64_t j = 0; j < dim; ++j) atomicAdd(a + j, c * grad[b * dim + j]);
  }
}

template <class V>
__global__ void update_kernel(TableRef<V> t, int64_t n, int64_t dim, OptimizerArgs opt,
                              BackwardScratch s) {
  const int64_t u = thread_index();
  if (u >= n || u >= *s.num_unique) return;
  const int64_t slot = s.unique_slots[u];
  update_row(opt, t.row(slot), dim, s.acc + u * dim);
  s.uid_of_slot[slot] = -1;
}

}  // namespace

template <class V>
void launch_find_or_insert_slots(const SlotSink<V>& sink, const UpsertArgs& args,
                                 const int64_t* keys, int64_t n, int8_t* status, int64_t* counts,
                                 cudaStream_t stream) {
  cudaMemsetAsync(counts, 0, 4 * sizeof(int64_t), stream);
  if (n == 0) return;
  slots_kernel<V><<<blocks_for(n), kBlock, 0, stream>>>(
      sink, args, keys, n, status, reinterpret_cast<unsigned long long*>(counts));
}

template <class V>
void launch_pool(const TableRef<V>& t, const int64_t* slots, const int64_t* keys,
                 const int64_t* offsets, int64_t num_bags, const float* weights, PoolingMode mode,
                 const InitArgs& missing, float* out, int64_t dim, cudaStream_t stream) {
  if (num_bags == 0) return;
  pool_kernel<V><<<blocks_for(num_bags), kBlock, 0, stream>>>(t, slots, keys, offsets, num_bags,
                                                              weights, mode, missing, out, dim);
}

template <class V>
void launch_gather(const TableRef<V>& t, const int64_t* slots, const int64_t* keys, int64_t n,
                   const InitArgs& missing, float* out, int64_t dim, cudaStream_t stream) {
  if (n == 0) return;
  gather_kernel<V><<<blocks_for(n), kBlock, 0, stream>>>(t, slots, keys, n, missing, out, dim);
}

template <class V>
void launch_backward(const TableRef<V>& t, const int64_t* slots, const int64_t* offsets,
                     int64_t num_bags, int64_t n, const float* weights, PoolingMode mode,
                     const float* grad, int64_t dim, const OptimizerArgs& opt,
                     const BackwardScratch& scratch, cudaStream_t stream) {
  cudaMemsetAsync(scratch.num_unique, 0, sizeof(int32_t), stream);
  if (n == 0) return;
  cudaMemsetAsync(scratch.acc, 0, static_cast<size_t>(n * dim) * sizeof(float), stream);
  assign_uid_kernel<<<blocks_for(n), kBlock, 0, stream>>>(slots, n, scratch);
  accumulate_kernel<<<blocks_for(num_bags), kBlock, 0, stream>>>(offsets, num_bags, weights, mode,
                                                                 grad, dim, scratch);
  update_kernel<V><<<blocks_for(n), kBlock, 0, stream>>>(t, n, dim, opt, scratch);
}

#define DYNEMB_INSTANTIATE(V)                                                                  \
  template void launch_find_or_insert_slots<V>(const SlotSink<V>&, const UpsertArgs&,          \
                                               const int64_t*, int64_t, int8_t*, int64_t*,     \
                                               cudaStream_t);                                  \
  template void launch_pool<V>(const TableRef<V>&, const int64_t*, const int64_t*,             \
                               const int64_t*, int64_t, const float*, PoolingMode,             \
                               const InitArgs&, float*, int64_t, cudaStream_t);                \
  template void launch_gather<V>(const TableRef<V>&, const int64_t*, const int64_t*, int64_t,  \
                                 const InitArgs&, float*, int64_t, cudaStream_t);              \
  template void launch_backward<V>(const TableRef<V>&, const int64_t*, const int64_t*, int64_t, \
                                   int64_t, const float*, PoolingMode, const float*, int64_t,  \
                                   const OptimizerArgs&, const BackwardScratch&, cudaStream_t);

DYNEMB_INSTANTIATE(float)
DYNEMB_INSTANTIATE(__half)
DYNEMB_INSTANTIATE(__nv_bfloat16)

}  // namespace dynemb::cuda
