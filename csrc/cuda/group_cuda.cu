// dynemb CUDA executor: prefix sums and stable grouping, the building blocks that
// let kernels keep core/table_ops.h's batch rule (keys of one home bucket in batch
// order) and core/pooling.h's gradient order (indices of one key in ascending order)
// without depending on thread scheduling. Kernels of one thread per chunk or per
// group, and a one-block scan (shared memory and block barriers) for up to
// kBlockScanMax elements: one launch where the chunked scan takes three to five.
#include "cuda/kernel_common.cuh"
#include "cuda/launchers_cuda.h"

namespace dynemb::DYNEMB_CUDA_NS {
namespace {

// A thread per 64 elements: with 1024, a table's scan of 16384 statuses ran on 16
// threads for ~70 us on an H100 (W-train-wide: 390 scans, 27 ms, per 3 steps).
constexpr int64_t kScanChunk = 64;
// launch_group_stable_radix: 8 bits of the group a pass, a thread per 256 elements.
constexpr int64_t kRadixDigits = 256;
constexpr int64_t kRadixChunk = 256;

/// Up to kBlockScanPer elements a thread of the one-block scan.
constexpr int64_t kBlockScanPer = 256;
constexpr int64_t kBlockScanMax = kBlock * kBlockScanPer;

/// launch_exclusive_scan by one block of kBlock threads: thread x sums its run of
/// ceil(n / kBlock) elements, the block scans the runs' sums in shared memory
/// (Hillis-Steele), each thread writes its run's prefixes (integer sums: the same
/// values as the chunked scan). out may be in: a thread reads its run before writing it.
__global__ void block_scan_kernel(const int64_t* in, int64_t n, int64_t* out, int64_t* total) {
  __shared__ int64_t sums[kBlock];
  const int x = static_cast<int>(threadIdx.x);
  const int64_t per = (n + kBlock - 1) / kBlock;
  const int64_t begin = x * per < n ? x * per : n;
  const int64_t end = begin + per < n ? begin + per : n;
  int64_t own = 0;
  for (int64_t i = begin; i < end; ++i) own += in[i];
  sums[x] = own;
  __syncthreads();
  for (int d = 1; d < kBlock; d *= 2) {
    const int64_t add = x >= d ? sums[x - d] : 0;
    __syncthreads();
    sums[x] += add;
    __syncthreads();
  }
  if (x == kBlock - 1) *total = sums[x];
  int64_t running = sums[x] - own;
  for (int64_t i = begin; i < end; ++i) {
    const int64_t v = in[i];
    out[i] = running;
    running += v;
  }
}

__global__ void chunk_sums_kernel(const int64_t* in, int64_t n, int64_t chunks, int64_t* sums) {
  const int64_t c = thread_index();
  if (c >= chunks) return;
  int64_t sum = 0;
  const int64_t end = (c + 1) * kScanChunk < n ? (c + 1) * kScanChunk : n;
  for (int64_t i = c * kScanChunk; i < end; ++i) sum += in[i];
  sums[c] = sum;
}

__global__ void scan_sums_kernel(int64_t* sums, int64_t chunks, int64_t* total) {
  if (thread_index() != 0) return;
  int64_t running = 0;
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t v = sums[c];
    sums[c] = running;
    running += v;
  }
  *total = running;
}

__global__ void chunk_scan_kernel(const int64_t* in, int64_t n, int64_t chunks,
                                  const int64_t* prefix, int64_t* out) {
  const int64_t c = thread_index();
  if (c >= chunks) return;
  int64_t running = prefix[c];
  const int64_t end = (c + 1) * kScanChunk < n ? (c + 1) * kScanChunk : n;
  for (int64_t i = c * kScanChunk; i < end; ++i) {
    const int64_t v = in[i];
    out[i] = running;
    running += v;
  }
}

__global__ void group_count_kernel(const int64_t* group, int64_t n, unsigned long long* counts) {
  const int64_t i = thread_index();
  if (i < n && group[i] >= 0) atomicAdd(counts + group[i], 1ULL);
}

/// Places element i in its group's part of order, counting the group's count down
/// (from the end: the order within a group is sorted afterwards), so no cursor array
/// needs zeroing.
__global__ void group_place_kernel(const int64_t* group, int64_t n, const int64_t* start,
                                   unsigned long long* counts, int64_t* order) {
  const int64_t i = thread_index();
  if (i >= n || group[i] < 0) return;
  const int64_t g = group[i];
  order[start[g] + static_cast<int64_t>(atomicAdd(counts + g, ~0ULL)) - 1] = i;
}

__global__ void group_sort_kernel(const int64_t* start, int64_t groups, int64_t* order) {
  const int64_t g = thread_index();
  if (g < groups) sort_ascending(order + start[g], start[g + 1] - start[g]);
}

/// Element k of a radix pass's input: src[k], or k itself in the first pass (src null).
__device__ inline int64_t radix_element(const int64_t* src, int64_t k) {
  return src ? src[k] : k;
}

/// A radix pass's input: the first pass reads all n elements (skipping those of group
/// < 0), the later ones the *valid (device) elements the first kept.
__device__ inline int64_t radix_inputs(const int64_t* src, int64_t n, const int64_t* valid) {
  return src ? *valid : n;
}

/// hist[d * chunks + c] = the elements of chunk c whose group's digit (8 bits at shift)
/// is d; a thread per chunk of kRadixChunk elements.
__global__ void radix_hist_kernel(const int64_t* group, const int64_t* src, int64_t n,
                                  const int64_t* valid, int shift, int64_t chunks,
                                  int64_t* hist) {
  const int64_t c = thread_index();
  if (c >= chunks) return;
  const int64_t m = radix_inputs(src, n, valid);
  const int64_t end = (c + 1) * kRadixChunk < m ? (c + 1) * kRadixChunk : m;
  for (int64_t k = c * kRadixChunk; k < end; ++k) {
    const int64_t g = group[radix_element(src, k)];
    if (g >= 0) ++hist[((g >> shift) & (kRadixDigits - 1)) * chunks + c];
  }
}

/// Each chunk's elements, in order, to their places: hist holds the exclusive prefix
/// sums of radix_hist_kernel's counts (digit-major), so the pass is stable.
__global__ void radix_scatter_kernel(const int64_t* group, const int64_t* src, int64_t n,
                                     const int64_t* valid, int shift, int64_t chunks,
                                     int64_t* hist, int64_t* dst) {
  const int64_t c = thread_index();
  if (c >= chunks) return;
  const int64_t m = radix_inputs(src, n, valid);
  const int64_t end = (c + 1) * kRadixChunk < m ? (c + 1) * kRadixChunk : m;
  for (int64_t k = c * kRadixChunk; k < end; ++k) {
    const int64_t e = radix_element(src, k);
    const int64_t g = group[e];
    if (g >= 0) dst[hist[((g >> shift) & (kRadixDigits - 1)) * chunks + c]++] = e;
  }
}

/// A key's home-bucket range, counted in its group's count (the grouping's first
/// step fused with the counting); thread 0 also zeroes `zero` (4 words), when given.
/// Keys past core live_keys(live, n) get group -1 (no range).
__global__ void bucket_ranges_kernel(const int64_t* keys, int64_t n, const int64_t* live,
                                     int64_t num_buckets, int64_t groups, int64_t* group,
                                     unsigned long long* counts, int64_t* zero,
                                     const int64_t* buckets) {
  const int64_t i = thread_index();
  if (i >= n) return;
  if (i == 0 && zero != nullptr) {
    for (int s = 0; s < kStatusCount; ++s) zero[s] = 0;
  }
  if (i >= live_keys(live, n)) {  // past the live keys: in no range
    group[i] = -1;
    return;
  }
  const int64_t b = buckets ? buckets[i] : bucket_of(hash_key(keys[i]), num_buckets);
  const int64_t g = bucket_range_of(b, groups, num_buckets);
  group[i] = g;
  atomicAdd(counts + g, 1ULL);
}

/// marked[c] = the marks == wanted in chunk c of kScanChunk; with counts, the other
/// marks (statuses) of the chunk are added to counts (an atomic per status and chunk).
__global__ void marked_counts_kernel(const int8_t* marks, int8_t wanted, int64_t n,
                                     const int64_t* live, int64_t chunks, int64_t* marked,
                                     int64_t* counts) {
  const int64_t c = thread_index();
  if (c >= chunks) return;
  const int64_t stop = live_keys(live, n);
  const int64_t end = (c + 1) * kScanChunk < stop ? (c + 1) * kScanChunk : stop;
  int64_t m = 0;
  unsigned long long local[kStatusCount] = {};
  for (int64_t i = c * kScanChunk; i < end; ++i) {
    if (marks[i] == wanted) {
      ++m;
    } else if (counts != nullptr) {
      ++local[marks[i]];
    }
  }
  marked[c] = m;
  if (counts == nullptr) return;
  for (int s = 0; s < kStatusCount; ++s) {
    if (local[s] != 0) atomicAdd(reinterpret_cast<unsigned long long*>(counts) + s, local[s]);
  }
}

/// Chunk c's marked elements, in order, from list[prefix[c]] on.
__global__ void scatter_marked_kernel(const int8_t* marks, int8_t wanted, int64_t n,
                                      const int64_t* live, int64_t chunks,
                                      const int64_t* prefix, int64_t* list) {
  const int64_t c = thread_index();
  if (c >= chunks) return;
  const int64_t stop = live_keys(live, n);
  const int64_t end = (c + 1) * kScanChunk < stop ? (c + 1) * kScanChunk : stop;
  int64_t p = prefix[c];
  for (int64_t i = c * kScanChunk; i < end; ++i) {
    if (marks[i] == wanted) list[p++] = i;
  }
}

}  // namespace

void launch_exclusive_scan(const int64_t* in, int64_t n, int64_t* out, int64_t* total,
                           Workspace& ws, cudaStream_t stream) {
  if (n <= kBlockScanMax) {
    DYNEMB_LAUNCH(1, kBlock, stream, block_scan_kernel)(in, n, out, total);
    return;
  }
  const int64_t chunks = (n + kScanChunk - 1) / kScanChunk;
  int64_t* sums = ws.array<int64_t>(chunks > 0 ? chunks : 1);
  if (chunks > 0) {
    DYNEMB_LAUNCH(blocks_for(chunks), kBlock, stream, chunk_sums_kernel)(in, n, chunks, sums);
  }
  if (chunks > kScanChunk) {
    launch_exclusive_scan(sums, chunks, sums, total, ws, stream);  // the chunk sums, in place
  } else {
    DYNEMB_LAUNCH(1, 1, stream, scan_sums_kernel)(sums, chunks, total);
  }
  if (chunks > 0) {
    DYNEMB_LAUNCH(blocks_for(chunks), kBlock, stream, chunk_scan_kernel)(in, n, chunks, sums,
                                                                         out);
  }
}

/// launch_list_marked; with counts, also launch_list_deferred's counting; with live,
/// of the first core live_keys(live, n) marks only.
static void list_marked(const int8_t* marks, int8_t wanted, int64_t n, const int64_t* live,
                        int64_t* list, int64_t* count, int64_t* counts, Workspace& ws,
                        cudaStream_t stream) {
  if (n == 0) {
    cudaMemsetAsync(count, 0, sizeof(int64_t), stream);
    return;
  }
  const int64_t chunks = (n + kScanChunk - 1) / kScanChunk;
  int64_t* prefix = ws.array<int64_t>(chunks);
  DYNEMB_LAUNCH(blocks_for(chunks), kBlock, stream, marked_counts_kernel)(
      marks, wanted, n, live, chunks, prefix, counts);
  launch_exclusive_scan(prefix, chunks, prefix, count, ws, stream);
  DYNEMB_LAUNCH(blocks_for(chunks), kBlock, stream, scatter_marked_kernel)(
      marks, wanted, n, live, chunks, prefix, list);
}

void launch_list_marked(const int8_t* marks, int8_t wanted, int64_t n, int64_t* list,
                        int64_t* count, Workspace& ws, cudaStream_t stream) {
  list_marked(marks, wanted, n, nullptr, list, count, nullptr, ws, stream);
}

void launch_list_deferred(const int8_t* status, int64_t n, const int64_t* live, int64_t* list,
                          int64_t* count, int64_t* counts, Workspace& ws, cudaStream_t stream) {
  list_marked(status, kDeferred, n, live, list, count, counts, ws, stream);
}

unsigned long long* zeroed_group_counts(int64_t groups, Workspace& ws, cudaStream_t stream) {
  auto* counts = ws.array<unsigned long long>(groups);
  cudaMemsetAsync(counts, 0, static_cast<size_t>(groups) * sizeof(unsigned long long), stream);
  return counts;
}

/// start[g] = the elements of groups before g (start[groups]: all of group >= 0), from
/// per-group counts; returns the counts (groups entries of workspace).
static unsigned long long* count_group_starts(const int64_t* group, int64_t n, int64_t groups,
                                              int64_t* start, Workspace& ws,
                                              cudaStream_t stream) {
  auto* counts = zeroed_group_counts(groups, ws, stream);
  if (n > 0) {
    DYNEMB_LAUNCH(blocks_for(n), kBlock, stream, group_count_kernel)(group, n, counts);
  }
  launch_exclusive_scan(reinterpret_cast<const int64_t*>(counts), groups, start, start + groups,
                        ws, stream);
  return counts;
}

void launch_place_by_group(const int64_t* group, int64_t n, int64_t groups,
                           unsigned long long* counts, int64_t* start, int64_t* order,
                           Workspace& ws, cudaStream_t stream) {
  launch_exclusive_scan(reinterpret_cast<const int64_t*>(counts), groups, start, start + groups,
                        ws, stream);
  if (n > 0) {
    DYNEMB_LAUNCH(blocks_for(n), kBlock, stream, group_place_kernel)(group, n, start, counts,
                                                                     order);
  }
}

void launch_group_stable(const int64_t* group, int64_t n, int64_t groups, int64_t* start,
                         int64_t* order, Workspace& ws, cudaStream_t stream) {
  auto* counts = zeroed_group_counts(groups, ws, stream);
  if (n > 0) {
    DYNEMB_LAUNCH(blocks_for(n), kBlock, stream, group_count_kernel)(group, n, counts);
  }
  launch_place_by_group(group, n, groups, counts, start, order, ws, stream);
  DYNEMB_LAUNCH(blocks_for(groups), kBlock, stream, group_sort_kernel)(start, groups, order);
}

void launch_group_stable_radix(const int64_t* group, int64_t n, int64_t groups, int64_t* start,
                               int64_t* order, Workspace& ws, cudaStream_t stream) {
  count_group_starts(group, n, groups, start, ws, stream);
  if (n == 0) return;
  int passes = 1;
  while (passes < 8 && ((groups - 1) >> (8 * passes)) != 0) ++passes;
  const int64_t chunks = (n + kRadixChunk - 1) / kRadixChunk;
  auto* hist = ws.array<int64_t>(kRadixDigits * chunks);
  auto* other = ws.array<int64_t>(n);
  auto* total = ws.array<int64_t>(1);
  const int64_t* valid = start + groups;  // elements of group >= 0, known on the device
  const int64_t* src = nullptr;
  for (int pass = 0; pass < passes; ++pass) {
    int64_t* dst = (passes - 1 - pass) % 2 == 0 ? order : other;  // the last pass: order
    const int shift = 8 * pass;
    cudaMemsetAsync(hist, 0, static_cast<size_t>(kRadixDigits * chunks) * sizeof(int64_t),
                    stream);
    DYNEMB_LAUNCH(blocks_for(chunks), kBlock, stream, radix_hist_kernel)(group, src, n, valid,
                                                                         shift, chunks, hist);
    launch_exclusive_scan(hist, kRadixDigits * chunks, hist, total, ws, stream);
    DYNEMB_LAUNCH(blocks_for(chunks), kBlock, stream, radix_scatter_kernel)(
        group, src, n, valid, shift, chunks, hist, dst);
    src = dst;
  }
}

BucketRanges group_by_home_bucket(const int64_t* keys, int64_t n, int64_t num_buckets,
                                  int64_t* zero_counts, Workspace& ws, cudaStream_t stream,
                                  const int64_t* live, const int64_t* buckets) {
  const int64_t ranges = bucket_range_count(n, num_buckets);
  int64_t* group = ws.array<int64_t>(n > 0 ? n : 1);
  int64_t* start = ws.array<int64_t>(ranges + 1);
  int64_t* order = ws.array<int64_t>(n > 0 ? n : 1);
  auto* counts = zeroed_group_counts(ranges, ws, stream);
  if (n > 0) {
    DYNEMB_LAUNCH(blocks_for(n), kBlock, stream, bucket_ranges_kernel)(
        keys, n, live, num_buckets, ranges, group, counts, zero_counts, buckets);
  }
  launch_place_by_group(group, n, ranges, counts, start, order, ws, stream);
  return {ranges, start, order};
}

}  // namespace dynemb::DYNEMB_CUDA_NS
