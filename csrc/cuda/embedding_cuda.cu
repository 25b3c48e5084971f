// dynemb CUDA executor: embedding kernels over the core maths (core/pooling.h,
// core/optimizer_rules.h, core/dedup.h, core/tier_ops.h, core/grouped.h: a
// pooling or backward covers every table of a batch in one launch per phase). Launch geometry and
// atomics only; no float atomics: gradients are summed in core/pooling.h's order.
#include "cuda/kernel_common.cuh"
#include "cuda/launchers_cuda.h"

namespace dynemb::DYNEMB_CUDA_NS {
namespace {

using P = CudaPlatform;

/// kRowLanes threads per bag of the batch (every part's bags, numbered one after
/// another), each pooling elements lane, lane + kRowLanes, ... of the bag.
template <class V>
__global__ void pool_kernel(Parts<PoolPart<V>> parts, int64_t num_bags, PoolingMode mode) {
  const int64_t x = thread_index() / kRowLanes;
  if (x >= num_bags) return;
  const PoolPart<V>& p = part_of(parts, x, &PoolPart<V>::bag_begin);
  const int64_t b = x - p.bag_begin;
  float* out = p.out.at(b);
  for (int64_t j = thread_index() % kRowLanes; j < p.dim; j += kRowLanes) {
    out[j] = pool_part_element(p, mode, b, j);
  }
}

/// kRowLanes threads per index, each copying elements lane, lane + kRowLanes, ...
template <class V>
__global__ void gather_kernel(TableRef<V> t, const int64_t* slots, const int64_t* keys, int64_t n,
                              InitArgs missing, float* out, int64_t dim) {
  const int64_t i = thread_index() / kRowLanes;
  if (i >= n) return;
  for (int64_t j = thread_index() % kRowLanes; j < dim; j += kRowLanes) {
    out[i * dim + j] = gather_element(t, slots, keys, i, missing, j);
  }
}

/// A tile of N lanes per moved key (core tile_exchange): the slow table probed by the
/// tile, the victim's and the new row copied by the lanes, 16 bytes a lane at a time.
template <unsigned N, class V>
__global__ void cache_exchange_kernel(TableRef<V> cache, TableRef<V> slow, CacheExchange<V> x) {
  const int64_t j = thread_index() / N;
  if (!has_move(x, j)) return;  // whole tiles
  const CgTile<N> tile;
  tile_exchange(tile, cache, slow, x, j);
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

/// Dedup pass 1, a thread per key of the call: the key's cell in its part's set;
/// first_rev[cell] = max over its indices of n - i.
__global__ void dedup_cells_kernel(Parts<DedupPart> parts, int64_t n, int64_t* cell_keys,
                                   int32_t* states, unsigned long long* first_rev,
                                   int64_t* cell_of) {
  const int64_t i = thread_index();
  if (i >= n) return;
  const DedupPart& p = part_of(parts, i, &DedupPart::index_begin);
  const DedupSetRef set{cell_keys + p.cell_begin, states + p.cell_begin, dedup_capacity(p.n)};
  bool is_new = false;
  const int64_t cell = p.cell_begin + dedup_cell<P>(set, p.keys[i - p.index_begin], &is_new);
  atomicMax(first_rev + cell, static_cast<unsigned long long>(n - i));
  cell_of[i] = cell;
}

__global__ void dedup_first_kernel(int64_t n, const unsigned long long* first_rev,
                                   const int64_t* cell_of, int64_t* is_first) {
  const int64_t i = thread_index();
  if (i < n) is_first[i] = first_rev[cell_of[i]] == static_cast<unsigned long long>(n - i);
}

/// A first occurrence's uid is the number of first occurrences before it in its part
/// (rank: first occurrences before it in the call).
__global__ void dedup_number_kernel(Parts<DedupPart> parts, int64_t n, const int64_t* cell_of,
                                    const int64_t* is_first, const int64_t* rank,
                                    int64_t* uid_of_cell, int64_t* unique) {
  const int64_t i = thread_index();
  if (i >= n || !is_first[i]) return;
  const DedupPart& p = part_of(parts, i, &DedupPart::index_begin);
  const int64_t uid = rank[i] - rank[p.index_begin];
  uid_of_cell[cell_of[i]] = uid;
  unique[p.index_begin + uid] = p.keys[i - p.index_begin];
}

__global__ void dedup_inverse_kernel(Parts<DedupPart> parts, int64_t n, const int64_t* cell_of,
                                     const int64_t* uid_of_cell, int64_t* inverse,
                                     unsigned long long* counts) {
  const int64_t i = thread_index();
  if (i >= n) return;
  const DedupPart& p = part_of(parts, i, &DedupPart::index_begin);
  const int64_t u = uid_of_cell[cell_of[i]];
  inverse[i] = u;
  atomicAdd(counts + p.index_begin + u, 1ULL);
}

/// num_unique[p] = the first occurrences of part p's keys; a thread per part.
__global__ void dedup_sizes_kernel(Parts<DedupPart> parts, const int64_t* is_first,
                                   const int64_t* rank, int64_t* num_unique) {
  const int64_t x = thread_index();
  if (x >= parts.count) return;
  const DedupPart& p = parts[x];
  const int64_t last = p.index_begin + p.n - 1;
  num_unique[x] = p.n == 0 ? 0 : rank[last] + is_first[last] - rank[p.index_begin];
}

/// bag_of[i] = the bag of index i, both in the batch's numbering; a thread per bag.
template <class V>
__global__ void bag_of_kernel(Parts<BackwardPart<V>> parts, int64_t num_bags, int64_t* bag_of) {
  const int64_t x = thread_index();
  if (x >= num_bags) return;
  const BackwardPart<V>& p = part_of(parts, x, &BackwardPart<V>::bag_begin);
  const int64_t b = x - p.bag_begin;
  for (int64_t i = p.offsets[b]; i < p.offsets[b + 1]; ++i) bag_of[p.index_begin + i] = x;
}

/// group[i] = the distinct key of index i in the batch's numbering (-1: no slot).
template <class V>
__global__ void gradient_groups_kernel(Parts<BackwardPart<V>> parts, int64_t n, int64_t* group) {
  const int64_t x = thread_index();
  if (x >= n) return;
  const BackwardPart<V>& p = part_of(parts, x, &BackwardPart<V>::index_begin);
  const int64_t u = p.inverse[x - p.index_begin];
  group[x] = p.unique_slots[u] >= 0 ? p.unique_begin + u : -1;
}

/// many[x] = the gradient chunks of distinct key x (core pooling.h) when it has more than
/// one, else 0: only those keys are summed chunk by chunk. A thread per key.
template <class V>
__global__ void chunk_counts_kernel(Parts<BackwardPart<V>> parts, int64_t num_unique,
                                    const int64_t* start, int64_t* many) {
  const int64_t x = thread_index();
  if (x >= num_unique) return;
  const int64_t chunks = gradient_chunks(start[x + 1] - start[x]);
  many[x] = chunks > 1 ? chunks : 0;
}

/// owner[g] = the key of chunk g (chunks numbered by chunk_begin); a thread per key.
__global__ void chunk_owner_kernel(int64_t num_unique, const int64_t* chunk_begin,
                                   int64_t* owner) {
  const int64_t x = thread_index();
  if (x >= num_unique) return;
  for (int64_t g = chunk_begin[x]; g < chunk_begin[x + 1]; ++g) owner[g] = x;
}

/// kRowLanes threads per distinct key of at most one chunk, each summing elements lane,
/// lane + kRowLanes, ... of its gradient in core/pooling.h's order (indices ascending,
/// from the stable grouping) into acc.
template <class V>
__global__ void reduce_kernel(Parts<BackwardPart<V>> parts, int64_t num_unique,
                              const int64_t* start, const int64_t* order, const int64_t* bag_of,
                              const int64_t* chunk_begin, PoolingMode mode, float* acc) {
  const int64_t x = thread_index() / kRowLanes;
  if (x >= num_unique || chunk_begin[x + 1] > chunk_begin[x]) return;
  const BackwardPart<V>& p = part_of(parts, x, &BackwardPart<V>::unique_begin);
  const int64_t u = x - p.unique_begin;
  if (p.unique_slots[u] < 0) return;
  float* key_acc = acc + p.acc_begin + u * p.dim;
  for (int64_t j = thread_index() % kRowLanes; j < p.dim; j += kRowLanes) {
    key_acc[j] = key_gradient_element(p, mode, order, start[x], start[x + 1], bag_of, j);
  }
}

/// kRowLanes threads per chunk of the keys of several chunks (a Zipf batch's hot keys:
/// thousands of indices, which one warp summed alone for most of the backward), each
/// summing elements of the chunk into its row of chunk_sums (max_dim floats a chunk).
template <class V>
__global__ void chunk_sum_kernel(Parts<BackwardPart<V>> parts, int64_t max_chunks,
                                 const int64_t* num_chunks, const int64_t* owner,
                                 const int64_t* chunk_begin, const int64_t* start,
                                 const int64_t* order, const int64_t* bag_of, PoolingMode mode,
                                 int64_t max_dim, float* chunk_sums) {
  const int64_t g = thread_index() / kRowLanes;
  if (g >= max_chunks || g >= *num_chunks) return;
  const int64_t x = owner[g];
  const BackwardPart<V>& p = part_of(parts, x, &BackwardPart<V>::unique_begin);
  const int64_t k0 = start[x] + (g - chunk_begin[x]) * kGradientChunk;
  const int64_t k1 = k0 + kGradientChunk < start[x + 1] ? k0 + kGradientChunk : start[x + 1];
  for (int64_t j = thread_index() % kRowLanes; j < p.dim; j += kRowLanes) {
    chunk_sums[g * max_dim + j] = key_gradient_element(p, mode, order, k0, k1, bag_of, j);
  }
}

/// kRowLanes threads per key of several chunks: its gradient into acc, the chunks' sums
/// added in order (core chunk_total_element).
template <class V>
__global__ void chunk_total_kernel(Parts<BackwardPart<V>> parts, int64_t num_unique,
                                   const int64_t* chunk_begin, const float* chunk_sums,
                                   int64_t max_dim, float* acc) {
  const int64_t x = thread_index() / kRowLanes;
  if (x >= num_unique || chunk_begin[x + 1] == chunk_begin[x]) return;
  const BackwardPart<V>& p = part_of(parts, x, &BackwardPart<V>::unique_begin);
  const int64_t u = x - p.unique_begin;
  if (p.unique_slots[u] < 0) return;
  const float* first = chunk_sums + chunk_begin[x] * max_dim;
  const int64_t count = chunk_begin[x + 1] - chunk_begin[x];
  for (int64_t j = thread_index() % kRowLanes; j < p.dim; j += kRowLanes) {
    acc[p.acc_begin + u * p.dim + j] = chunk_total_element(first, max_dim, count, j);
  }
}

/// One thread per distinct key: the optimizer update of its row by reduce_kernel's sum.
template <class V>
__global__ void update_kernel(Parts<BackwardPart<V>> parts, int64_t num_unique,
                              OptimizerArgs opt, float* acc) {
  const int64_t x = thread_index();
  if (x >= num_unique) return;
  const BackwardPart<V>& p = part_of(parts, x, &BackwardPart<V>::unique_begin);
  const int64_t u = x - p.unique_begin;
  if (p.unique_slots[u] < 0) return;
  update_key(p, opt, u, acc + p.acc_begin + u * p.dim);
}

}  // namespace

template <class V>
void launch_pool(const Parts<PoolPart<V>>& parts, const PartTotals& totals, PoolingMode mode,
                 cudaStream_t stream) {
  if (totals.bags == 0) return;
  DYNEMB_LAUNCH(blocks_for(totals.bags * kRowLanes), kBlock, stream, pool_kernel<V>)(
      parts, totals.bags, mode);
}

template <class V>
void launch_gather(const TableRef<V>& t, const int64_t* slots, const int64_t* keys, int64_t n,
                   const InitArgs& missing, float* out, int64_t dim, cudaStream_t stream) {
  if (n == 0) return;
  DYNEMB_LAUNCH(blocks_for(n * kRowLanes), kBlock, stream, gather_kernel<V>)(t, slots, keys, n,
                                                                             missing, out, dim);
}

template <class V>
void launch_cache_exchange(const TableRef<V>& cache, const TableRef<V>& slow,
                           const CacheExchange<V>& x, cudaStream_t stream) {
  if (x.m == 0) return;
  constexpr unsigned N = kRowTileLanes;
  DYNEMB_LAUNCH(blocks_for(x.m * N), kBlock, stream, cache_exchange_kernel<N, V>)(cache, slow, x);
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

void launch_dedup(const Parts<DedupPart>& parts, const PartTotals& totals, int64_t* unique,
                  int64_t* inverse, int64_t* counts, int64_t* num_unique, Workspace& ws,
                  cudaStream_t stream) {
  const int64_t n = totals.indices, cells = totals.cells;
  auto* cell_keys = ws.array<int64_t>(cells);
  auto* states = ws.array<int32_t>(cells);
  auto* first_rev = ws.array<unsigned long long>(cells);
  auto* uid_of_cell = ws.array<int64_t>(cells);
  auto* cell_of = ws.array<int64_t>(n > 0 ? n : 1);
  auto* is_first = ws.array<int64_t>(n > 0 ? n : 1);
  auto* rank = ws.array<int64_t>(n > 0 ? n : 1);
  auto* total = ws.array<int64_t>(1);
  if (n > 0) {
    static_assert(kEmptyCell == -1, "states are filled with 0xFF bytes");
    cudaMemsetAsync(states, 0xFF, static_cast<size_t>(cells) * sizeof(int32_t), stream);
    cudaMemsetAsync(first_rev, 0, static_cast<size_t>(cells) * sizeof(unsigned long long),
                    stream);
    cudaMemsetAsync(counts, 0, static_cast<size_t>(n) * sizeof(int64_t), stream);
    DYNEMB_LAUNCH(blocks_for(n), kBlock, stream, dedup_cells_kernel)(parts, n, cell_keys, states,
                                                                     first_rev, cell_of);
    DYNEMB_LAUNCH(blocks_for(n), kBlock, stream, dedup_first_kernel)(n, first_rev, cell_of,
                                                                     is_first);
    launch_exclusive_scan(is_first, n, rank, total, ws, stream);
    DYNEMB_LAUNCH(blocks_for(n), kBlock, stream, dedup_number_kernel)(
        parts, n, cell_of, is_first, rank, uid_of_cell, unique);
    DYNEMB_LAUNCH(blocks_for(n), kBlock, stream, dedup_inverse_kernel)(
        parts, n, cell_of, uid_of_cell, inverse, reinterpret_cast<unsigned long long*>(counts));
  }
  DYNEMB_LAUNCH(blocks_for(parts.count), kBlock, stream, dedup_sizes_kernel)(parts, is_first,
                                                                             rank, num_unique);
}

template <class V>
void launch_backward(const Parts<BackwardPart<V>>& parts, const PartTotals& totals,
                     PoolingMode mode, const OptimizerArgs& opt, Workspace& ws,
                     cudaStream_t stream) {
  const int64_t n = totals.indices, num_unique = totals.unique;
  if (num_unique == 0) return;
  auto* bag_of = ws.array<int64_t>(n > 0 ? n : 1);
  auto* group = ws.array<int64_t>(n > 0 ? n : 1);
  auto* order = ws.array<int64_t>(n > 0 ? n : 1);
  auto* start = ws.array<int64_t>(num_unique + 1);
  auto* acc = ws.array<float>(totals.acc > 0 ? totals.acc : 1);
  if (totals.bags > 0) {
    DYNEMB_LAUNCH(blocks_for(totals.bags), kBlock, stream, bag_of_kernel<V>)(parts, totals.bags,
                                                                             bag_of);
  }
  if (n > 0) {
    DYNEMB_LAUNCH(blocks_for(n), kBlock, stream, gradient_groups_kernel<V>)(parts, n, group);
  }
  launch_group_stable_radix(group, n, num_unique, start, order, ws, stream);
  // Keys of several gradient chunks: chunk_begin numbers their chunks (a key of more
  // than kGradientChunk indices has at most 2 n_u / kGradientChunk chunks, so all
  // together at most 2 n / kGradientChunk: the grid and the workspace without reading
  // the count back).
  const int64_t max_chunks = 2 * n / kGradientChunk + 1, max_dim = totals.max_dim;
  auto* chunk_begin = ws.array<int64_t>(num_unique + 1);
  auto* owner = ws.array<int64_t>(max_chunks);
  auto* chunk_sums = ws.array<float>(max_chunks * max_dim);
  DYNEMB_LAUNCH(blocks_for(num_unique), kBlock, stream, chunk_counts_kernel<V>)(
      parts, num_unique, start, chunk_begin);
  launch_exclusive_scan(chunk_begin, num_unique, chunk_begin, chunk_begin + num_unique, ws,
                        stream);
  DYNEMB_LAUNCH(blocks_for(num_unique), kBlock, stream, chunk_owner_kernel)(num_unique,
                                                                            chunk_begin, owner);
  DYNEMB_LAUNCH(blocks_for(num_unique * kRowLanes), kBlock, stream, reduce_kernel<V>)(
      parts, num_unique, start, order, bag_of, chunk_begin, mode, acc);
  DYNEMB_LAUNCH(blocks_for(max_chunks * kRowLanes), kBlock, stream, chunk_sum_kernel<V>)(
      parts, max_chunks, chunk_begin + num_unique, owner, chunk_begin, start, order, bag_of,
      mode, max_dim, chunk_sums);
  DYNEMB_LAUNCH(blocks_for(num_unique * kRowLanes), kBlock, stream, chunk_total_kernel<V>)(
      parts, num_unique, chunk_begin, chunk_sums, max_dim, acc);
  DYNEMB_LAUNCH(blocks_for(num_unique), kBlock, stream, update_kernel<V>)(parts, num_unique, opt,
                                                                          acc);
}

#define DYNEMB_INSTANTIATE(V)                                                                  \
  template void launch_pool<V>(const Parts<PoolPart<V>>&, const PartTotals&, PoolingMode,    \
                               cudaStream_t);                                                  \
  template void launch_gather<V>(const TableRef<V>&, const int64_t*, const int64_t*, int64_t,  \
                                 const InitArgs&, float*, int64_t, cudaStream_t);              \
  template void launch_backward<V>(const Parts<BackwardPart<V>>&, const PartTotals&,        \
                                   PoolingMode, const OptimizerArgs&, Workspace&,              \
                                   cudaStream_t);                                              \
  template void launch_cache_exchange<V>(const TableRef<V>&, const TableRef<V>&,               \
                                         const CacheExchange<V>&, cudaStream_t);

DYNEMB_INSTANTIATE(float)
DYNEMB_INSTANTIATE(__half)
DYNEMB_INSTANTIATE(__nv_bfloat16)

}  // namespace dynemb::DYNEMB_CUDA_NS
