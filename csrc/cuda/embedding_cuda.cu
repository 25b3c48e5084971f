// dynemb CUDA executor: embedding kernels over the core maths (core/pooling.h,
// core/optimizer_rules.h). Launch geometry and atomics only.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cuda/kernel_common.cuh"
#include "cuda/launchers_cuda.h"

namespace dynemb::cuda {
namespace {

using P = CudaPlatform;

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

template <class V>
__global__ void cache_exchange_kernel(TableRef<V> cache, TableRef<V> slow, CacheExchange<V> x) {
  const int64_t j = thread_index();
  if (j >= x.m) return;
  save_victim(cache, x, j);
  fetch_entry<P>(cache, slow, x, j, -1);
}

__global__ void cache_move_flags_kernel(const int8_t* status, int64_t n, bool* moved,
                                        bool* evicted) {
  const int64_t i = thread_index();
  if (i >= n) return;
  moved[i] = moves_in(status[i]);
  evicted[i] = evicts_resident(status[i]);
}

__global__ void dedup_kernel(const int64_t* keys, int64_t n, DedupSetRef set,
                             int64_t* inverse, unsigned long long* counts) {
  const int64_t i = thread_index();
  if (i >= n) return;
  bool is_new = false;
  const int32_t u = dedup_insert<P>(set, keys[i], &is_new);
  inverse[i] = u;
  atomicAdd(counts + u, 1ULL);
}

__global__ void accumulate_kernel(const int64_t* unique_slots, const int64_t* inverse,
                                  const int64_t* offsets, int64_t num_bags, const float* weights,
                                  PoolingMode mode, const float* grad, int64_t dim, float* acc) {
  const int64_t b = thread_index();
  if (b >= num_bags) return;
  const int64_t begin = offsets[b], end = offsets[b + 1];
  for (int64_t i = begin; i < end; ++i) {
    const int64_t u = inverse[i];
    if (unique_slots[u] < 0) continue;
    const float c = grad_scale(mode, weights, i, begin, end);
    for (int64_t j = 0; j < dim; ++j) atomicAdd(acc + u * dim + j, c * grad[b * dim + j]);
  }
}

template <class V>
__global__ void update_kernel(TableRef<V> t, const int64_t* unique_slots, int64_t num_unique,
                              int64_t dim, OptimizerArgs opt, const float* acc) {
  const int64_t u = thread_index();
  if (u < num_unique && unique_slots[u] >= 0) update_row(opt, t.row(unique_slots[u]), dim, acc + u * dim);
}

}  // namespace

template <class V>
void launch_find_or_insert_slots(const SlotSink<V>& sink, const UpsertArgs& args,
                                 const int64_t* keys, int64_t n, int8_t* status, int64_t* counts,
                                 cudaStream_t stream) {
  launch_upsert<V>(sink, args, keys, n, status, counts, stream);
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
void launch_cache_exchange(const TableRef<V>& cache, const TableRef<V>& slow,
                           const CacheExchange<V>& x, cudaStream_t stream) {
  if (x.m > 0) cache_exchange_kernel<V><<<blocks_for(x.m), kBlock, 0, stream>>>(cache, slow, x);
}

void launch_cache_move_flags(const int8_t* status, int64_t n, bool* moved, bool* evicted,
                             cudaStream_t stream) {
  if (n == 0) return;
  cache_move_flags_kernel<<<blocks_for(n), kBlock, 0, stream>>>(status, n, moved, evicted);
}

void launch_dedup(const int64_t* keys, int64_t n, int64_t* cell_keys, int32_t* cell_uids,
                  int64_t capacity, int32_t* num_unique, int64_t* unique, int64_t* inverse,
                  int64_t* counts, cudaStream_t stream) {
  cudaMemsetAsync(num_unique, 0, sizeof(int32_t), stream);
  cudaMemsetAsync(counts, 0, static_cast<size_t>(n) * sizeof(int64_t), stream);
  if (n == 0) return;
  const DedupSetRef set{cell_keys, cell_uids, capacity, num_unique, unique};
  dedup_kernel<<<blocks_for(n), kBlock, 0, stream>>>(
      keys, n, set, inverse, reinterpret_cast<unsigned long long*>(counts));
}

template <class V>
void launch_backward(const TableRef<V>& t, const int64_t* unique_slots, int64_t num_unique,
                     const int64_t* inverse, const int64_t* offsets, int64_t num_bags,
                     const float* weights, PoolingMode mode, const float* grad, int64_t dim,
                     const OptimizerArgs& opt, float* acc, cudaStream_t stream) {
  if (num_unique == 0) return;
  cudaMemsetAsync(acc, 0, static_cast<size_t>(num_unique * dim) * sizeof(float), stream);
  accumulate_kernel<<<blocks_for(num_bags), kBlock, 0, stream>>>(
      unique_slots, inverse, offsets, num_bags, weights, mode, grad, dim, acc);
  update_kernel<V><<<blocks_for(num_unique), kBlock, 0, stream>>>(t, unique_slots, num_unique,
                                                                  dim, opt, acc);
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
  template void launch_backward<V>(const TableRef<V>&, const int64_t*, int64_t, const int64_t*, \
                                   const int64_t*, int64_t, const float*, PoolingMode,         \
                                   const float*, int64_t, const OptimizerArgs&, float*,        \
                                   cudaStream_t);                                  \
  template void launch_cache_exchange<V>(const TableRef<V>&, const TableRef<V>&,               \
                                         const CacheExchange<V>&, cudaStream_t);

DYNEMB_INSTANTIATE(float)
DYNEMB_INSTANTIATE(__half)
DYNEMB_INSTANTIATE(__nv_bfloat16)

}  // namespace dynemb::cuda
