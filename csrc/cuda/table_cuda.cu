// dynemb CUDA executor: table batch ops over the core algorithm (core/table_ops.h).
// Nothing here decides anything: launch geometry and atomics only. Mutating ops keep
// the core's batch rule with stable grouping by home-bucket range (group_cuda.cu),
// so their results are those of the CPU executor, bit for bit.
#include "core/tile_erase.h"
#include "core/tile_rehash.h"
#include "cuda/kernel_common.cuh"
#include "cuda/launchers_cuda.h"
#include "cuda/tile.cuh"

namespace dynemb::DYNEMB_CUDA_NS {
namespace {

/// A tile of N lanes per key (tile.cuh kRowTileLanes): the lanes probe together (core
/// tile_find_slot: each reads a chunk of the bucket's digests and votes), then copy the
/// row 16 bytes a lane at a time (core copy_row with Lanes).
template <unsigned N, class V>
__global__ void find_kernel(TableRef<V> t, const int64_t* keys, int64_t n, V* out,
                            int64_t out_width, bool* found) {
  const int64_t i = thread_index() / N;
  if (i >= n) return;  // whole tiles: n tiles fill blocks of kBlock threads from the start
  const CgTile<N> tile;
  const int64_t slot = tile_find_slot(tile, t, keys[i]);
  if (tile.rank() == 0) found[i] = slot >= 0;
  V* dst = out + i * out_width;
  const Lanes l = lanes_of(tile);
  if (slot < 0) {
    zero_row(dst, out_width, l);  // absent keys: a zero row
    return;
  }
  if (tile.rank() == 0) t.count_row(Access::kRowRead, slot, out_width * int64_t{sizeof(V)});
  copy_row(t.row(slot), dst, out_width, l);
}

/// A tile of kSlotLanes lanes per key: a 128-slot bucket's digests in one 16-byte load
/// per lane.
constexpr unsigned kSlotLanes = 8;

template <class V>
__global__ void find_slots_kernel(TableRef<V> t, const int64_t* keys, int64_t n,
                                  int64_t* slots) {
  const int64_t i = thread_index() / kSlotLanes;
  if (i >= n) return;
  const CgTile<kSlotLanes> tile;
  const int64_t slot = tile_find_slot(tile, t, keys[i]);
  if (tile.rank() == 0) slots[i] = slot;
}

/// Erase pass 1 (core tile_erase_home), a tile per home-bucket range, its keys in
/// batch order; deferred[i] = 1 for a key pass 2 must look for along its chain.
template <class V>
__global__ void erase_home_kernel(TableRef<V> t, const int64_t* keys, const int64_t* start,
                                  int64_t* order, int64_t ranges, bool* erased,
                                  int8_t* deferred) {
  const int64_t g = thread_index() / kSlotLanes;
  if (g >= ranges) return;  // whole tiles
  const CgTile<kSlotLanes> tile;
  sort_range(tile, order, start[g], start[g + 1]);
  for (int64_t k = start[g]; k < start[g + 1]; ++k) {
    const int64_t i = order[k];
    const EraseHome e = tile_erase_home(tile, t, keys[i]);
    if (tile.rank() == 0) {
      erased[i] = e == EraseHome::kErased;
      deferred[i] = e == EraseHome::kDeferred ? 1 : 0;
    }
  }
}

/// Erase pass 2 (core tile_erase_key): one tile, the deferred keys in batch order.
template <class V>
__global__ void erase_chained_kernel(TableRef<V> t, const int64_t* keys, const int64_t* list,
                                     const int64_t* count, bool* erased) {
  const CgTile<kSlotLanes> tile;
  for (int64_t k = 0; k < *count; ++k) {
    const bool e = tile_erase_key(tile, t, keys[list[k]]);
    if (tile.rank() == 0) erased[list[k]] = e;
  }
}

/// group[s] = the destination home-bucket range of source slot s, -1 for an empty slot.
template <class V>
__global__ void rehash_ranges_kernel(TableRef<V> src, int64_t dst_buckets, int64_t ranges,
                                     int64_t* group) {
  const int64_t s = thread_index();
  if (s >= src.num_slots()) return;
  if (src.digest(s) == kEmptyDigest) {
    group[s] = -1;
    return;
  }
  const auto b = static_cast<uint64_t>(bucket_of(hash_key(src.key(s)), dst_buckets));
  group[s] = static_cast<int64_t>(b * static_cast<uint64_t>(ranges) /
                                  static_cast<uint64_t>(dst_buckets));
}

/// Rehash pass 1 (core tile_place_home), a tile of N lanes per destination
/// home-bucket range, its entries in source-slot order; deferred[s] = 1 for what pass 1
/// leaves (past the home's limit).
template <unsigned N, class V>
__global__ void rehash_home_kernel(TableRef<V> src, TableRef<V> dst, int window,
                                   const int64_t* start, const int64_t* order, int64_t ranges,
                                   uint8_t* deferred) {
  const int64_t g = thread_index() / N;
  if (g >= ranges) return;  // whole tiles
  const CgTile<N> tile;
  for (int64_t k = start[g]; k < start[g + 1]; ++k) {
    const int64_t s = order[k];
    const int64_t slot = tile_place_home(tile, dst, src, s, window);
    if (slot < 0 && tile.rank() == 0) deferred[s] = 1;
  }
}

/// Rehash pass 2 (core tile_place_moved): one tile of N lanes, in source-slot order.
template <unsigned N, class V>
__global__ void rehash_rest_kernel(TableRef<V> src, TableRef<V> dst, int window,
                                   const int64_t* deferred, const int64_t* count,
                                   int64_t* failed) {
  const CgTile<N> tile;
  int64_t lost = 0;
  for (int64_t k = 0; k < *count; ++k) {
    lost += tile_place_moved(tile, dst, src, deferred[k], window) < 0;
  }
  if (tile.rank() == 0) *failed = lost;
}

// The grouped training lookup (launch_upsert_grouped): the kernels of launch_upsert
// over every part at once, each position finding its part (core/grouped.h part_of)
// and running the per-table rule on the part's table.
template <class V>
using Lookups = Parts<UpsertPart<V>>;

/// A thread per key of the call: its home-bucket range, numbered after the earlier
/// parts' ranges (the per-table formula of group_by_home_bucket within a part), counted
/// in its range's count.
/// With `chosen` (grouped_choose_buckets_kernel's), the range of the key's chosen
/// bucket instead.
template <class V>
__global__ void grouped_bucket_ranges_kernel(Lookups<V> parts, int64_t n, int64_t* group,
                                             unsigned long long* counts, const int64_t* chosen) {
  const int64_t x = thread_index();
  if (x >= n) return;
  const UpsertPart<V>& q = part_of(parts, x, &UpsertPart<V>::key_begin);
  const int64_t buckets = q.sink.t.num_buckets;
  const int64_t b = chosen ? chosen[x] : bucket_of(hash_key(q.keys[x - q.key_begin]), buckets);
  const int64_t g = q.range_begin + bucket_range_of(b, q.ranges, buckets);
  group[x] = g;
  atomicAdd(counts + g, 1ULL);
}

/// A part's sink where it lies (the kernel's parameters), not a copy: a local copy of
/// a part picked at run time held every field of the sink in registers (142 a thread
/// in grouped_upsert_ranges_kernel; 82 without). The sinks only read their members:
/// their writes go through the pointers they hold.
template <class V>
__device__ SlotSink<V>& sink_of(const UpsertPart<V>& q) {
  return const_cast<SlotSink<V>&>(q.sink);
}

/// Pass 0 for the parts that choose buckets (core chooses_buckets), a tile of kSlotLanes
/// lanes per key of the call: chosen[x] is its chosen bucket and stored[x] the slot
/// storing it or -1 (tile_choose_bucket), or its home and -1 in the other parts. It
/// reads the tables only.
template <class V>
__global__ void grouped_choose_buckets_kernel(Lookups<V> parts, int64_t n, int64_t* chosen,
                                              int64_t* stored) {
  const int64_t x = thread_index() / kSlotLanes;
  if (x >= n) return;  // whole tiles
  const CgTile<kSlotLanes> tile;
  const UpsertPart<V>& q = part_of(parts, x, &UpsertPart<V>::key_begin);
  const int64_t key = q.keys[x - q.key_begin];
  int64_t slot = -1;
  const int64_t b = chooses_buckets(q.sink.t, q.args)
                        ? tile_choose_bucket(tile, q.sink.t, key, KeyProbe(q.sink.t, key), &slot)
                        : bucket_of(hash_key(key), q.sink.t.num_buckets);
  if (tile.rank() == 0) {
    chosen[x] = b;
    stored[x] = slot;
  }
}

/// Pass 1, a tile of kSlotLanes lanes per bucket range of the call (its part's keys
/// and table): the lanes probe, the sink records slots (and initialises new rows).
/// `chosen`, `stored`: pass 0's buckets and stored slots, or null. At most 128
/// registers a thread, so that two blocks of kBlock fit an SM.
template <class V>
__global__ void __launch_bounds__(kBlock, 2)
    grouped_upsert_ranges_kernel(Lookups<V> parts, const int64_t* start, int64_t* order,
                                 int64_t ranges, const int64_t* chosen, const int64_t* stored) {
  const int64_t g = thread_index() / kSlotLanes;
  if (g >= ranges) return;  // whole tiles
  const CgTile<kSlotLanes> tile;
  sort_range(tile, order, start[g], start[g + 1]);
  const UpsertPart<V>& q = part_of(parts, g, &UpsertPart<V>::range_begin);
  const bool part_chooses = chosen != nullptr && chooses_buckets(q.sink.t, q.args);
  upsert_range(tile, q.sink.t, sink_of(q), q.args, q.keys, q.key_begin, order, start[g],
               start[g + 1], q.status, nullptr, part_chooses ? chosen + q.key_begin : nullptr,
               part_chooses ? stored + q.key_begin : nullptr);
}

/// Pass 2: one tile of kSlotLanes lanes, the deferred positions of the call in order
/// (part by part, each part's in batch order), by core tile_upsert_spill.
template <class V>
__global__ void grouped_upsert_deferred_kernel(Lookups<V> parts, const int64_t* deferred,
                                               const int64_t* count) {
  const CgTile<kSlotLanes> tile;
  for (int64_t k = 0; k < *count; ++k) {
    const UpsertPart<V>& q = part_of(parts, deferred[k], &UpsertPart<V>::key_begin);
    const int64_t i = deferred[k] - q.key_begin;
    const Status s = tile_upsert_spill(tile, q.sink.t, i, i, q.keys[i], q.args, sink_of(q));
    if (tile.rank() == 0) q.status[i] = static_cast<int8_t>(s);
  }
}

/// A thread per chunk of kStatusChunk statuses of the call adds them to the counts of
/// their parts (a chunk may span parts).
template <class V>
__global__ void grouped_count_status_kernel(Lookups<V> parts, const int8_t* status, int64_t n) {
  int64_t x = thread_index() * kStatusChunk;
  if (x >= n) return;
  const int64_t end = x + kStatusChunk < n ? x + kStatusChunk : n;
  while (x < end) {
    const UpsertPart<V>& q = part_of(parts, x, &UpsertPart<V>::key_begin);
    const int64_t stop = q.key_begin + q.n < end ? q.key_begin + q.n : end;
    add_status_counts(status, x, stop, q.counts);
    x = stop;
  }
}

}  // namespace

template <class V>
void launch_upsert_grouped(const Parts<UpsertPart<V>>& parts, const PartTotals& totals,
                           int8_t* status, Workspace& ws, cudaStream_t stream) {
  const int64_t n = totals.indices, ranges = totals.ranges;
  if (n == 0) return;  // the caller zeroed the counts
  int64_t* group = ws.array<int64_t>(n);
  int64_t* start = ws.array<int64_t>(ranges + 1);
  int64_t* order = ws.array<int64_t>(n);
  auto* counts = zeroed_group_counts(ranges, ws, stream);
  int64_t* chosen = nullptr;
  int64_t* stored = nullptr;
  if (totals.two_buckets) {  // pass 0 for the parts that choose buckets
    chosen = ws.array<int64_t>(n);
    stored = ws.array<int64_t>(n);
    DYNEMB_LAUNCH(blocks_for(n * kSlotLanes), kBlock, stream, grouped_choose_buckets_kernel<V>)(
        parts, n, chosen, stored);
  }
  DYNEMB_LAUNCH(blocks_for(n), kBlock, stream, grouped_bucket_ranges_kernel<V>)(parts, n, group,
                                                                                counts, chosen);
  launch_place_by_group(group, n, ranges, counts, start, order, ws, stream);
  DYNEMB_LAUNCH(blocks_for(ranges * kSlotLanes), kBlock, stream,
                grouped_upsert_ranges_kernel<V>)(parts, start, order, ranges, chosen, stored);
  if (totals.two_buckets) {  // else pass 1 decided every key (tile_upsert_owned)
    int64_t* deferred = ws.array<int64_t>(n);
    int64_t* deferred_count = ws.array<int64_t>(1);
    launch_list_marked(status, kDeferred, n, deferred, deferred_count, ws, stream);
    DYNEMB_LAUNCH(1, kSlotLanes, stream, grouped_upsert_deferred_kernel<V>)(parts, deferred,
                                                                           deferred_count);
  }
  DYNEMB_LAUNCH(blocks_for((n + kStatusChunk - 1) / kStatusChunk), kBlock, stream,
                grouped_count_status_kernel<V>)(parts, status, n);
}

template <class V>
void launch_find(const TableRef<V>& t, const int64_t* keys, int64_t n, V* out, int64_t out_width,
                 bool* found, cudaStream_t stream) {
  if (n == 0) return;
  constexpr unsigned N = kRowTileLanes;
  DYNEMB_LAUNCH(blocks_for(n * N), kBlock, stream, find_kernel<N, V>)(t, keys, n, out, out_width,
                                                                     found);
}

template <class V>
void launch_find_slots(const TableRef<V>& t, const int64_t* keys, int64_t n, int64_t* slots,
                       cudaStream_t stream) {
  if (n == 0) return;
  DYNEMB_LAUNCH(blocks_for(n * kSlotLanes), kBlock, stream, find_slots_kernel<V>)(t, keys, n,
                                                                                 slots);
}

template <class Sink>
void launch_upsert_keys(const Sink& sink, const UpsertArgs& args, const int64_t* keys, int64_t n,
                        const int64_t* live, int8_t* status, int64_t* counts, Workspace& ws,
                        cudaStream_t stream) {
  launch_upsert<typename decltype(sink.t)::Value>(sink, args, keys, n, live, status, counts, ws,
                                                  stream);
}

template <class V>
void launch_erase(const TableRef<V>& t, const int64_t* keys, int64_t n, bool* erased,
                  Workspace& ws, cudaStream_t stream) {
  if (n == 0) return;
  const BucketRanges r = group_by_home_bucket(keys, n, t.num_buckets, nullptr, ws, stream);
  auto* deferred = ws.array<int8_t>(n);
  DYNEMB_LAUNCH(blocks_for(r.count * kSlotLanes), kBlock, stream, erase_home_kernel<V>)(
      t, keys, r.start, r.order, r.count, erased, deferred);
  int64_t* list = ws.array<int64_t>(n);
  int64_t* count = ws.array<int64_t>(1);
  launch_list_marked(deferred, 1, n, list, count, ws, stream);
  DYNEMB_LAUNCH(1, kSlotLanes, stream, erase_chained_kernel<V>)(t, keys, list, count, erased);
}

template <class V>
void launch_rehash(const TableRef<V>& src, const TableRef<V>& dst, int window, int64_t* failed,
                   Workspace& ws, cudaStream_t stream) {
  const int64_t slots = src.num_slots();
  const int64_t ranges = bucket_range_count(slots, dst.num_buckets);
  int64_t* group = ws.array<int64_t>(slots);
  int64_t* start = ws.array<int64_t>(ranges + 1);
  int64_t* order = ws.array<int64_t>(slots);
  auto* deferred = ws.array<uint8_t>(slots);
  cudaMemsetAsync(deferred, 0, static_cast<size_t>(slots), stream);
  DYNEMB_LAUNCH(blocks_for(slots), kBlock, stream, rehash_ranges_kernel<V>)(src, dst.num_buckets,
                                                                            ranges, group);
  launch_group_stable(group, slots, ranges, start, order, ws, stream);
  int64_t* rest = ws.array<int64_t>(slots);
  int64_t* rest_count = ws.array<int64_t>(1);
  constexpr unsigned N = kRowTileLanes;
  DYNEMB_LAUNCH(blocks_for(ranges * N), kBlock, stream, rehash_home_kernel<N, V>)(
      src, dst, window, start, order, ranges, deferred);
  launch_list_marked(reinterpret_cast<const int8_t*>(deferred), 1, slots, rest, rest_count, ws,
                     stream);
  DYNEMB_LAUNCH(1, N, stream, rehash_rest_kernel<N, V>)(src, dst, window, rest, rest_count,
                                                        failed);
}

#define DYNEMB_INSTANTIATE(V)                                                                   \
  template void launch_find<V>(const TableRef<V>&, const int64_t*, int64_t, V*, int64_t, bool*, \
                               cudaStream_t);                                                   \
  template void launch_find_slots<V>(const TableRef<V>&, const int64_t*, int64_t, int64_t*,     \
                                     cudaStream_t);                                             \
  template void launch_upsert_keys(const FindOrInsertSink<V>&, const UpsertArgs&,              \
                                   const int64_t*, int64_t, const int64_t*, int8_t*, int64_t*,  \
                                   Workspace&, cudaStream_t);                                   \
  template void launch_upsert_keys(const AssignSink<V>&, const UpsertArgs&, const int64_t*,    \
                                   int64_t, const int64_t*, int8_t*, int64_t*, Workspace&,      \
                                   cudaStream_t);                                               \
  template void launch_upsert_keys(const RestoreSink<V>&, const UpsertArgs&, const int64_t*,   \
                                   int64_t, const int64_t*, int8_t*, int64_t*, Workspace&,      \
                                   cudaStream_t);                                               \
  template void launch_upsert_keys(const SlotSink<V>&, const UpsertArgs&, const int64_t*,      \
                                   int64_t, const int64_t*, int8_t*, int64_t*, Workspace&,      \
                                   cudaStream_t);                                               \
  template void launch_upsert_grouped<V>(const Parts<UpsertPart<V>>&, const PartTotals&,       \
                                         int8_t*, Workspace&, cudaStream_t);                    \
  template void launch_erase<V>(const TableRef<V>&, const int64_t*, int64_t, bool*, Workspace&, \
                                cudaStream_t);                                                  \
  template void launch_rehash<V>(const TableRef<V>&, const TableRef<V>&, int, int64_t*,         \
                                 Workspace&, cudaStream_t);

DYNEMB_INSTANTIATE(float)
DYNEMB_INSTANTIATE(__half)
DYNEMB_INSTANTIATE(__nv_bfloat16)

}  // namespace dynemb::DYNEMB_CUDA_NS
