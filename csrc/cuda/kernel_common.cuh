// dynemb CUDA executor: launch geometry, workspace, and the batch-rule kernels
// shared by the .cu files (torch-free).
#pragma once

#include "core/grouped.h"
#include "core/table_ops.h"
#include "core/tile_ops.h"
#include "cuda/cuda_platform.cuh"
#include "cuda/launchers_cuda.h"
#include "cuda/tile.cuh"

namespace dynemb::DYNEMB_CUDA_NS {

constexpr int kBlock = 256;

/// Threads that read one row together (a warp): thread x serves item x / kRowLanes and
/// elements lane, lane + kRowLanes, ... of its row, so that a warp's loads of a row
/// coalesce. A thread per item made each lane read its own row: 32 scattered loads per
/// instruction (find at dim 64 ran at 238 M keys/s on an H100, 5892 at dim 8).
constexpr int64_t kRowLanes = 32;

inline unsigned blocks_for(int64_t n) {
  return static_cast<unsigned>((n + kBlock - 1) / kBlock);
}

__device__ inline int64_t thread_index() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}

/// out[i] = in[0] + ... + in[i-1] for i in [0, n) (out may be in); *total (device) =
/// the sum of all. Up to 65,536 elements one block scans them (one launch); more, in
/// chunks of kScanChunk elements: a thread per chunk sums it, the chunk sums are
/// scanned (by this scan, recursively), a thread per chunk writes its prefixes.
void launch_exclusive_scan(const int64_t* in, int64_t n, int64_t* out, int64_t* total,
                           Workspace& ws, cudaStream_t stream);

/// Stable grouping: for the elements i in [0, n) whose group[i] >= 0, order[start[g]
/// .. start[g + 1]) lists the elements of group g in ascending i. start (groups + 1)
/// and order (n) are outputs. Atomic placement, then a thread per group sorts its
/// elements: for groups of a few elements (a batch's distinct keys by bucket range).
void launch_group_stable(const int64_t* group, int64_t n, int64_t groups, int64_t* start,
                         int64_t* order, Workspace& ws, cudaStream_t stream);

/// Zeroed per-group counts (groups entries of workspace) for a kernel that counts its
/// elements' groups itself (atomicAdd), before launch_place_by_group.
unsigned long long* zeroed_group_counts(int64_t groups, Workspace& ws, cudaStream_t stream);

/// start (groups + 1) from the groups' counts, then order (n): each group's elements in
/// no particular order (its consumer sorts them: sort_range); the counts end at zero.
void launch_place_by_group(const int64_t* group, int64_t n, int64_t groups,
                           unsigned long long* counts, int64_t* start, int64_t* order,
                           Workspace& ws, cudaStream_t stream);

/// launch_group_stable's result for groups of any size (a Zipf batch's indices by
/// distinct key: the hottest key's thousands of indices took one thread ~0.9 ms to sort
/// on an H100): a stable LSD radix sort of the elements by group, 8 bits a pass, each
/// pass a histogram, a prefix sum and a scatter of a thread per chunk, in chunk order.
void launch_group_stable_radix(const int64_t* group, int64_t n, int64_t groups, int64_t* start,
                               int64_t* order, Workspace& ws, cudaStream_t stream);

/// list[0 .. *count) = the indices i in [0, n) with marks[i] == wanted, ascending;
/// *count (device) their number. So that a one-tile pass (the batch rule's pass 2)
/// visits only the elements it has work for instead of scanning all n. Three launches
/// up to 2^22 elements: a thread per chunk of kScanChunk counts its marks, a scan, a
/// thread per chunk lists them.
void launch_list_marked(const int8_t* marks, int8_t wanted, int64_t n, int64_t* list,
                        int64_t* count, Workspace& ws, cudaStream_t stream);

/// launch_list_marked of an upsert's kDeferred statuses that also adds the other
/// statuses to counts (kStatusCount, zeroed), in the same launches: pass 2 adds those
/// of the keys it decides.
/// live: core live_keys (null: all n); the statuses past it are not read.
void launch_list_deferred(const int8_t* status, int64_t n, const int64_t* live, int64_t* list,
                          int64_t* count, int64_t* counts, Workspace& ws, cudaStream_t stream);

/// A batch's keys grouped by home-bucket range: order[start[r] .. start[r + 1]) for r
/// in [0, count) (device arrays) holds range r's positions in no particular order:
/// the tile that serves the range sorts them (sort_range: batch order) first, which
/// saves a launch.
struct BucketRanges {
  int64_t count;
  const int64_t* start;
  int64_t* order;
};

/// Groups keys (n) of a table of num_buckets buckets by home-bucket range (or, with
/// `buckets`, by the range of buckets[i]: pass 0's chosen buckets); zero_counts
/// (kStatusCount, or null) is zeroed by the same launches (an upsert's counts). With
/// live (device, core live_keys), the keys past *live are in no range.
BucketRanges group_by_home_bucket(const int64_t* keys, int64_t n, int64_t num_buckets,
                                  int64_t* zero_counts, Workspace& ws, cudaStream_t stream,
                                  const int64_t* live = nullptr,
                                  const int64_t* buckets = nullptr);

/// Heapsort of a[0..m) ascending: in place, O(m log m) even for one huge group.
__device__ inline void sort_ascending(int64_t* a, int64_t m) {
  auto sift = [a](int64_t root, int64_t end) {
    for (;;) {
      int64_t child = 2 * root + 1;
      if (child >= end) return;
      if (child + 1 < end && a[child] < a[child + 1]) ++child;
      if (a[root] >= a[child]) return;
      const int64_t x = a[root];
      a[root] = a[child];
      a[child] = x;
      root = child;
    }
  };
  for (int64_t r = m / 2 - 1; r >= 0; --r) sift(r, m);
  for (int64_t end = m - 1; end > 0; --end) {
    const int64_t x = a[0];
    a[0] = a[end];
    a[end] = x;
    sift(0, end);
  }
}

/// A BucketRanges range's positions order[begin .. end) into batch order (ascending:
/// positions are distinct, so any sort gives the same order), by the lanes of the tile
/// that serves the range together: a bitonic sort in place whose merges start with a
/// mirrored step, so every comparator sorts upwards and one whose upper element lies
/// past the range (a virtual +infinity) is skipped: any length, no padding. Each step
/// lane r takes the comparators of elements r, r + N, ..., then the tile syncs. A range
/// of m keys takes log2(m) (log2(m) + 1) / 2 steps (6 for m <= 8, none for one key)
/// where one lane's heap sort took m log m compare-exchanges while the others waited.
template <class Tile>
__device__ void sort_range(const Tile& tile, int64_t* order, int64_t begin, int64_t end) {
  int64_t* a = order + begin;
  const int64_t m = end - begin;
  for (int64_t p = 2; p / 2 < m; p *= 2) {  // sorted runs of p / 2 merged into runs of p
    for (int64_t q = p; q >= 2; q /= 2) {   // q == p: the mirrored step; then half-cleaners
      for (int64_t i = tile.rank(); i < m; i += Tile::kSize) {
        const int64_t offset = i % q;
        if (offset >= q / 2) continue;  // the upper element of its pair
        const int64_t j = q == p ? i - offset + (q - 1 - offset) : i + q / 2;
        if (j < m && a[j] < a[i]) {
          const int64_t x = a[i];
          a[i] = a[j];
          a[j] = x;
        }
      }
      tile.sync();
    }
  }
}

/// Status pass 1 leaves for pass 2 (never a dynemb::Status value).
constexpr int8_t kDeferred = -2;

/// A thread per chunk of kStatusChunk statuses counts them in registers, then adds its
/// counts: an atomic per status (all of them on 4 words) took 0.77 ms per 2^20 keys on
/// an H100, half the time of the upsert itself.
constexpr int64_t kStatusChunk = 256;

/// counts (kStatusCount) += the statuses [begin, end), counted in registers first.
__device__ inline void add_status_counts(const int8_t* status, int64_t begin, int64_t end,
                                         int64_t* counts) {
  unsigned long long local[kStatusCount] = {};
  for (int64_t i = begin; i < end; ++i) ++local[status[i]];
  for (int s = 0; s < kStatusCount; ++s) {
    if (local[s] != 0) atomicAdd(reinterpret_cast<unsigned long long*>(counts) + s, local[s]);
  }
}

/// The batch rule's pass 1 over one home-bucket range, by a tile that owns its
/// buckets (core/tile_ops.h: no lock, no fence): the positions order[begin .. end) in
/// batch order (position x is key x - base of `keys`, status[x - base]): under
/// hits_first tile_touch_or_place_free for all of them first (one probe: hits and keys
/// with a free home slot), then, for the keys it leaves, tile_place_by_victim in a
/// distinct batch, else tile_upsert_owned (which decides every key when the spill
/// window is one bucket: an evicting strategy), as the CPU executor does. Lane 0 writes
/// the statuses and, with `counted` (kStatusCount, lane 0's registers), counts them.
/// `chosen`, `stored` (indexed as keys, or null): pass 0's bucket of each key (core
/// tile_choose_bucket), which then runs in it (tile_upsert_owned<true>), and the slot pass 0
/// found it stored in, or -1 (then its hit there: tile_hit_stored; in a distinct batch,
/// a key found in neither bucket takes a free slot there without a find:
/// tile_place_new_chosen).
template <class Tile, class V, class Sink>
__device__ void upsert_range(const Tile& tile, const TableRef<V>& t, Sink& sink,
                             const UpsertArgs& args, const int64_t* keys, int64_t base,
                             const int64_t* order, int64_t begin, int64_t end, int8_t* status,
                             unsigned long long* counted = nullptr,
                             const int64_t* chosen = nullptr, const int64_t* stored = nullptr) {
  const bool first_hits = hits_first(args);
  const bool count = counted != nullptr && tile.rank() == 0;
  if (first_hits) {
    for (int64_t k = begin; k < end; ++k) {
      const int64_t i = order[k] - base;
      Status s;
      const bool decided = tile_touch_or_place_free(tile, t, i, i, keys[i], KeyProbe(t, keys[i]),
                                                    args, sink, &s);
      if (tile.rank() == 0) status[i] = decided ? static_cast<int8_t>(s) : kDeferred;
      if (count && decided) ++counted[static_cast<int>(s)];
    }
    tile.sync();  // every lane reads the statuses below
  }
  for (int64_t k = begin; k < end; ++k) {
    const int64_t i = order[k] - base;
    if (first_hits && status[i] != kDeferred) continue;
    KeyProbe p(t, keys[i]);
    Status s;
    bool decided = true;
    if (chosen != nullptr && stored[i] >= 0) {
      s = tile_hit_stored(tile, t, i, i, stored[i], args, sink);
    } else if (chosen != nullptr) {
      p.bucket = chosen[i];
      decided = args.distinct
                    ? tile_place_new_chosen(tile, t, i, i, keys[i], p, args, sink, &s)
                    : tile_upsert_owned<true>(tile, t, i, i, keys[i], p, args, sink, &s);
    } else if (first_hits && args.distinct) {
      s = tile_place_by_victim(tile, t, i, i, keys[i], p, args, sink);
    } else {
      decided = tile_upsert_owned(tile, t, i, i, keys[i], p, args, sink, &s);
    }
    if (tile.rank() == 0) status[i] = decided ? static_cast<int8_t>(s) : kDeferred;
    if (count && decided) ++counted[static_cast<int>(s)];
  }
}

/// counts (kStatusCount) += the statuses the block's threads counted in `local` (zeros
/// in the lanes that count none): their sum in shared memory, then one atomic per status
/// and block. Every thread of the block calls it (two block barriers).
__device__ inline void add_block_counts(const unsigned long long* local, int64_t* counts) {
  __shared__ unsigned long long block[kStatusCount];
  if (threadIdx.x < kStatusCount) block[threadIdx.x] = 0;
  __syncthreads();
  for (int s = 0; s < kStatusCount; ++s) {
    if (local[s] != 0) atomicAdd(&block[s], local[s]);
  }
  __syncthreads();
  if (threadIdx.x < kStatusCount && block[threadIdx.x] != 0) {
    atomicAdd(reinterpret_cast<unsigned long long*>(counts) + threadIdx.x, block[threadIdx.x]);
  }
}

/// The batch rule's pass 1, a tile of N lanes per home-bucket range (its positions
/// sorted first: group_by_home_bucket leaves them unsorted). kDecidesAll (a spill window
/// of one bucket: tile_upsert_owned decides every key): the kernel also adds the
/// statuses to counts, a block at a time, and no pass 2 follows.
template <unsigned N, bool kDecidesAll, class V, class Sink>
__global__ void upsert_ranges_kernel(TableRef<V> t, Sink sink, UpsertArgs args,
                                     const int64_t* keys, const int64_t* start, int64_t* order,
                                     int64_t ranges, int8_t* status, int64_t* counts,
                                     const int64_t* chosen, const int64_t* stored) {
  const int64_t g = thread_index() / N;
  unsigned long long local[kStatusCount] = {};
  if (g < ranges) {  // whole tiles; the others only meet the block's barriers
    const CgTile<N> tile;
    sort_range(tile, order, start[g], start[g + 1]);
    upsert_range(tile, t, sink, args, keys, 0, order, start[g], start[g + 1], status,
                 kDecidesAll ? local : nullptr, chosen, stored);
  }
  if constexpr (kDecidesAll) add_block_counts(local, counts);
}

/// The batch rule's pass 0 (core chooses_buckets): a tile of N lanes per key writes its
/// chosen bucket and the slot storing it, or -1 (tile_choose_bucket); it reads the
/// table only.
template <unsigned N, class V>
__global__ void choose_buckets_kernel(TableRef<V> t, const int64_t* keys, int64_t n,
                                      const int64_t* live, int64_t* chosen, int64_t* stored) {
  const int64_t i = thread_index() / N;
  if (i >= live_keys(live, n)) return;  // whole tiles
  const CgTile<N> tile;
  int64_t slot;
  const int64_t b = tile_choose_bucket(tile, t, keys[i], KeyProbe(t, keys[i]), &slot);
  if (tile.rank() == 0) {
    chosen[i] = b;
    stored[i] = slot;
  }
}

/// The batch rule's pass 2: one tile of N lanes (a block of N threads: it owns the
/// table), the deferred keys (deferred[0 .. *count), in batch order) by core
/// tile_upsert_spill. A GPU thread scanning every status took 90 ms per 2^20 keys on
/// an H100 even with nothing deferred; the list costs a few parallel launches.
/// Lane 0 adds the statuses it decides to counts (launch_list_deferred counted the rest).
template <unsigned N, class V, class Sink>
__global__ void upsert_deferred_kernel(TableRef<V> t, Sink sink, UpsertArgs args,
                                       const int64_t* keys, const int64_t* deferred,
                                       const int64_t* count, int8_t* status, int64_t* counts) {
  const CgTile<N> tile;
  unsigned long long local[kStatusCount] = {};
  for (int64_t k = 0; k < *count; ++k) {
    const int64_t i = deferred[k];
    const Status s = tile_upsert_spill(tile, t, i, i, keys[i], args, sink);
    if (tile.rank() == 0) status[i] = static_cast<int8_t>(s);
    ++local[static_cast<int>(s)];
  }
  if (tile.rank() != 0) return;
  for (int s = 0; s < kStatusCount; ++s) {
    if (local[s] != 0) atomicAdd(reinterpret_cast<unsigned long long*>(counts) + s, local[s]);
  }
}

/// A batch upsert by the batch rule with any Sink; status (n) and counts (4) out. Eight
/// launches and a memset: the grouping by range (its first kernel also zeroes counts),
/// pass 1 (which sorts each range), the deferred list (which counts the other
/// statuses), pass 2. Where the spill window is one bucket (every evicting strategy)
/// pass 1 decides and counts every key: four launches and the memset. With live
/// (device, core live_keys), only the first *live keys: n sizes the launches, the keys
/// past *live are in no range and not counted.
template <class V, class Sink>
void launch_upsert(const Sink& sink, const UpsertArgs& args, const int64_t* keys, int64_t n,
                   const int64_t* live, int8_t* status, int64_t* counts, Workspace& ws,
                   cudaStream_t stream) {
  if (n == 0) {
    cudaMemsetAsync(counts, 0, kStatusCount * sizeof(int64_t), stream);
    return;
  }
  const TableRef<V>& t = sink.t;
  constexpr unsigned N = kRowTileLanes;
  int64_t* chosen = nullptr;
  int64_t* stored = nullptr;
  if (chooses_buckets(t, args)) {
    chosen = ws.array<int64_t>(n);
    stored = ws.array<int64_t>(n);
    DYNEMB_LAUNCH(blocks_for(n * N), kBlock, stream, choose_buckets_kernel<N, V>)(t, keys, n, live,
                                                                                 chosen, stored);
  }
  const BucketRanges r =
      group_by_home_bucket(keys, n, t.num_buckets, counts, ws, stream, live, chosen);
  const bool decides_all = window_of(t, args.score.strategy) == 1;
  int64_t* deferred = decides_all ? nullptr : ws.array<int64_t>(n);
  int64_t* deferred_count = decides_all ? nullptr : ws.array<int64_t>(1);
  if (decides_all) {
    DYNEMB_LAUNCH(blocks_for(r.count * N), kBlock, stream, upsert_ranges_kernel<N, true, V, Sink>)(
        t, sink, args, keys, r.start, r.order, r.count, status, counts, nullptr, nullptr);
    return;
  }
  DYNEMB_LAUNCH(blocks_for(r.count * N), kBlock, stream, upsert_ranges_kernel<N, false, V, Sink>)(
      t, sink, args, keys, r.start, r.order, r.count, status, nullptr, chosen, stored);
  launch_list_deferred(status, n, live, deferred, deferred_count, counts, ws, stream);
  DYNEMB_LAUNCH(1, N, stream, upsert_deferred_kernel<N, V, Sink>)(t, sink, args, keys, deferred,
                                                                  deferred_count, status, counts);
}

}  // namespace dynemb::DYNEMB_CUDA_NS
