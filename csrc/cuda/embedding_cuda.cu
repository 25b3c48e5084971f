// dynemb CUDA executor: embedding kernels over the core maths (core/pooling.h,
// core/optimizer_rules.h, core/dedup.h, core/tier_ops.h). Launch geometry and
// atomics only; no float atomics: gradients are summed in core/pooling.h's order.
#include "cuda/kernel_common.cuh"
#include "cuda/launchers_cuda.h"

namespace dynemb::DYNEMB_CUDA_NS {
namespace {

using P = CudaPlatform;

template <class V>
__global__ void pool_kernel(TableRef<V> t, const int64_t* slots, const int64_t* keys,
                            const int64_t* offsets, int64_t num_bags, const float* weights,
                            PoolingMode mode, InitArgs missing, BagRows<float> out,
                            int64_t dim) {
  const int64_t b = thread_index();
  if (b >= num_bags) return;
  pool_bag(t, slots, keys, weights, offsets[b], offsets[b + 1], mode, missing, out.at(b), dim);
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

constexpr int64_t kMoveChunk = 1024;

__global__ void move_counts_kernel(const int8_t* status, const int64_t* slots, int64_t n,
                                   int64_t chunks, int64_t* counts) {
  const int64_t c = thread_index();
  if (c >= chunks) return;
  const int64_t end = (c + 1) * kMoveChunk < n ? (c + 1) * kMoveChunk : n;
  const MoveCounts m = compact_moves(status, slots, c * kMoveChunk, end, 0, 0, nullptr, nullptr);
  counts[3 * c] = m.moved;
  counts[3 * c + 1] = m.victims;
  counts[3 * c + 2] = m.without_slot;
}

/// Exclusive prefix sums of the chunks' (moved, victims) in place; totals (3) out.
__global__ void move_prefix_kernel(int64_t* counts, int64_t chunks, int64_t* totals) {
  if (thread_index() != 0) return;
  int64_t running[3] = {0, 0, 0};
  for (int64_t c = 0; c < chunks; ++c) {
    for (int k = 0; k < 3; ++k) {
      const int64_t v = counts[3 * c + k];
      counts[3 * c + k] = running[k];
      running[k] += v;
    }
  }
  for (int k = 0; k < 3; ++k) totals[k] = running[k];
}

__global__ void move_compact_kernel(const int8_t* status, const int64_t* slots, int64_t n,
                                    int64_t chunks, const int64_t* prefix, int64_t* moved,
                                    int64_t* victim_index) {
  const int64_t c = thread_index();
  if (c >= chunks) return;
  const int64_t end = (c + 1) * kMoveChunk < n ? (c + 1) * kMoveChunk : n;
  compact_moves(status, slots, c * kMoveChunk, end, prefix[3 * c], prefix[3 * c + 1], moved,
                victim_index);
}

/// Dedup pass 1: each key's cell; first_rev[cell] = max over its indices of n - i.
__global__ void dedup_cells_kernel(const int64_t* keys, int64_t n, DedupSetRef set,
                                   unsigned long long* first_rev, int64_t* cell_of) {
  const int64_t i = thread_index();
  if (i >= n) return;
  bool is_new = false;
  const int64_t cell = dedup_cell<P>(set, keys[i], &is_new);
  atomicMax(first_rev + cell, static_cast<unsigned long long>(n - i));
  cell_of[i] = cell;
}

__global__ void dedup_first_kernel(int64_t n, const unsigned long long* first_rev,
                                   const int64_t* cell_of, int64_t* is_first) {
  const int64_t i = thread_index();
  if (i < n) is_first[i] = first_rev[cell_of[i]] == static_cast<unsigned long long>(n - i);
}

/// A first occurrence's uid is the number of first occurrences before it.
__global__ void dedup_number_kernel(const int64_t* keys, int64_t n, const int64_t* cell_of,
                                    const int64_t* is_first, const int64_t* rank,
                                    int64_t* uid_of_cell, int64_t* unique) {
  const int64_t i = thread_index();
  if (i >= n || !is_first[i]) return;
  uid_of_cell[cell_of[i]] = rank[i];
  unique[rank[i]] = keys[i];
}

__global__ void dedup_inverse_kernel(int64_t n, const int64_t* cell_of,
                                     const int64_t* uid_of_cell, int64_t* inverse,
                                     unsigned long long* counts) {
  const int64_t i = thread_index();
  if (i >= n) return;
  const int64_t u = uid_of_cell[cell_of[i]];
  inverse[i] = u;
  atomicAdd(counts + u, 1ULL);
}

__global__ void bag_of_kernel(const int64_t* offsets, int64_t num_bags, int64_t* bag_of) {
  const int64_t b = thread_index();
  if (b >= num_bags) return;
  for (int64_t i = offsets[b]; i < offsets[b + 1]; ++i) bag_of[i] = b;
}

__global__ void gradient_groups_kernel(const int64_t* inverse, int64_t n,
                                       const int64_t* unique_slots, int64_t* group) {
  const int64_t i = thread_index();
  if (i < n) group[i] = unique_slots[inverse[i]] >= 0 ? inverse[i] : -1;
}

/// One thread per distinct key: its gradient in core/pooling.h's order (indices
/// ascending, from the stable grouping), then the optimizer update of its row.
template <class V>
__global__ void reduce_update_kernel(TableRef<V> t, const int64_t* unique_slots,
                                     int64_t num_unique, const int64_t* start,
                                     const int64_t* order, const int64_t* bag_of,
                                     const int64_t* offsets, const float* weights,
                                     PoolingMode mode, BagRows<const float> grad,
                                     int64_t dim, OptimizerArgs opt, float* acc) {
  const int64_t u = thread_index();
  if (u >= num_unique || unique_slots[u] < 0) return;
  float* a = acc + u * dim;
  for (int64_t j = 0; j < dim; ++j) a[j] = 0.0f;
  for (int64_t k = start[u]; k < start[u + 1]; ++k) {
    const int64_t i = order[k];
    const int64_t b = bag_of[i];
    add_gradient(a, grad_scale(mode, weights, i, offsets[b], offsets[b + 1]), grad.at(b),
                 dim);
  }
  update_row(opt, t.row(unique_slots[u]), dim, a);
}

}  // namespace

template <class V>
void launch_pool(const TableRef<V>& t, const int64_t* slots, const int64_t* keys,
                 const int64_t* offsets, int64_t num_bags, const float* weights, PoolingMode mode,
                 const InitArgs& missing, const BagRows<float>& out, int64_t dim,
                 cudaStream_t stream) {
  if (num_bags == 0) return;
  DYNEMB_LAUNCH(blocks_for(num_bags), kBlock, stream, pool_kernel<V>)(
      t, slots, keys, offsets, num_bags, weights, mode, missing, out, dim);
}

template <class V>
void launch_gather(const TableRef<V>& t, const int64_t* slots, const int64_t* keys, int64_t n,
                   const InitArgs& missing, float* out, int64_t dim, cudaStream_t stream) {
  if (n == 0) return;
  DYNEMB_LAUNCH(blocks_for(n), kBlock, stream, gather_kernel<V>)(t, slots, keys, n, missing, out,
                                                                 dim);
}

template <class V>
void launch_cache_exchange(const TableRef<V>& cache, const TableRef<V>& slow,
                           const CacheExchange<V>& x, cudaStream_t stream) {
  if (x.m == 0) return;
  DYNEMB_LAUNCH(blocks_for(x.m), kBlock, stream, cache_exchange_kernel<V>)(cache, slow, x);
}

void launch_cache_moves(const int8_t* status, const int64_t* slots, int64_t n, int64_t* moved,
                        int64_t* victim_index, int64_t* totals, Workspace& ws,
                        cudaStream_t stream) {
  const int64_t chunks = (n + kMoveChunk - 1) / kMoveChunk;
  int64_t* counts = ws.array<int64_t>(3 * (chunks > 0 ? chunks : 1));
  if (chunks > 0) {
    DYNEMB_LAUNCH(blocks_for(chunks), kBlock, stream, move_counts_kernel)(status, slots, n,
                                                                          chunks, counts);
  }
  DYNEMB_LAUNCH(1, 1, stream, move_prefix_kernel)(counts, chunks, totals);
  if (chunks > 0) {
    DYNEMB_LAUNCH(blocks_for(chunks), kBlock, stream, move_compact_kernel)(
        status, slots, n, chunks, counts, moved, victim_index);
  }
}

void launch_dedup(const int64_t* keys, int64_t n, int64_t* unique, int64_t* inverse,
                  int64_t* counts, int64_t* num_unique, Workspace& ws, cudaStream_t stream) {
  cudaMemsetAsync(num_unique, 0, sizeof(int64_t), stream);
  if (n == 0) return;
  const int64_t capacity = dedup_capacity(n);
  auto* cell_keys = ws.array<int64_t>(capacity);
  auto* states = ws.array<int32_t>(capacity);
  auto* first_rev = ws.array<unsigned long long>(capacity);
  auto* uid_of_cell = ws.array<int64_t>(capacity);
  auto* cell_of = ws.array<int64_t>(n);
  auto* is_first = ws.array<int64_t>(n);
  auto* rank = ws.array<int64_t>(n);
  static_assert(kEmptyCell == -1, "states are filled with 0xFF bytes");
  cudaMemsetAsync(states, 0xFF, static_cast<size_t>(capacity) * sizeof(int32_t), stream);
  cudaMemsetAsync(first_rev, 0, static_cast<size_t>(capacity) * sizeof(unsigned long long),
                  stream);
  cudaMemsetAsync(counts, 0, static_cast<size_t>(n) * sizeof(int64_t), stream);
  const DedupSetRef set{cell_keys, states, capacity};
  DYNEMB_LAUNCH(blocks_for(n), kBlock, stream, dedup_cells_kernel)(keys, n, set, first_rev,
                                                                   cell_of);
  DYNEMB_LAUNCH(blocks_for(n), kBlock, stream, dedup_first_kernel)(n, first_rev, cell_of,
                                                                   is_first);
  launch_exclusive_scan(is_first, n, rank, num_unique, ws, stream);
  DYNEMB_LAUNCH(blocks_for(n), kBlock, stream, dedup_number_kernel)(keys, n, cell_of, is_first,
                                                                    rank, uid_of_cell, unique);
  DYNEMB_LAUNCH(blocks_for(n), kBlock, stream, dedup_inverse_kernel)(
      n, cell_of, uid_of_cell, inverse, reinterpret_cast<unsigned long long*>(counts));
}

template <class V>
void launch_backward(const TableRef<V>& t, const int64_t* unique_slots, int64_t num_unique,
                     const int64_t* inverse, const int64_t* offsets, int64_t num_bags,
                     const float* weights, PoolingMode mode, const BagRows<const float>& grad,
                     int64_t dim, const OptimizerArgs& opt, int64_t n, Workspace& ws,
                     cudaStream_t stream) {
  if (num_unique == 0) return;
  auto* bag_of = ws.array<int64_t>(n > 0 ? n : 1);
  auto* group = ws.array<int64_t>(n > 0 ? n : 1);
  auto* order = ws.array<int64_t>(n > 0 ? n : 1);
  auto* start = ws.array<int64_t>(num_unique + 1);
  auto* acc = ws.array<float>(num_unique * dim);
  if (num_bags > 0) {
    DYNEMB_LAUNCH(blocks_for(num_bags), kBlock, stream, bag_of_kernel)(offsets, num_bags, bag_of);
  }
  if (n > 0) {
    DYNEMB_LAUNCH(blocks_for(n), kBlock, stream, gradient_groups_kernel)(inverse, n, unique_slots,
                                                                         group);
  }
  launch_group_stable(group, n, num_unique, start, order, ws, stream);
  DYNEMB_LAUNCH(blocks_for(num_unique), kBlock, stream, reduce_update_kernel<V>)(
      t, unique_slots, num_unique, start, order, bag_of, offsets, weights, mode, grad, dim, opt,
      acc);
}

#define DYNEMB_INSTANTIATE(V)                                                                  \
  template void launch_pool<V>(const TableRef<V>&, const int64_t*, const int64_t*,             \
                               const int64_t*, int64_t, const float*, PoolingMode,             \
                               const InitArgs&, const BagRows<float>&, int64_t,                \
                               cudaStream_t);                                                  \
  template void launch_gather<V>(const TableRef<V>&, const int64_t*, const int64_t*, int64_t,  \
                                 const InitArgs&, float*, int64_t, cudaStream_t);              \
  template void launch_backward<V>(const TableRef<V>&, const int64_t*, int64_t, const int64_t*, \
                                   const int64_t*, int64_t, const float*, PoolingMode,         \
                                   const BagRows<const float>&, int64_t,                       \
                                   const OptimizerArgs&, int64_t,                              \
                                   Workspace&, cudaStream_t);                                  \
  template void launch_cache_exchange<V>(const TableRef<V>&, const TableRef<V>&,               \
                                         const CacheExchange<V>&, cudaStream_t);

DYNEMB_INSTANTIATE(float)
DYNEMB_INSTANTIATE(__half)
DYNEMB_INSTANTIATE(__nv_bfloat16)

}  // namespace dynemb::DYNEMB_CUDA_NS
