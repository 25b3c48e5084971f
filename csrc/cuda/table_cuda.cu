// dynemb CUDA executor: table batch ops, one thread per key over the core
// algorithm (core/table_ops.h). Nothing here decides anything: launch geometry
// and atomics only. Keys of a batch run concurrently, so in-batch order between
// keys of one bucket is not fixed on the GPU (the CPU executor fixes it).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cuda/kernel_common.cuh"
#include "cuda/launchers_cuda.h"

namespace dynemb::cuda {
namespace {

using P = CudaPlatform;

template <class V>
__global__ void find_kernel(TableRef<V> t, const int64_t* keys, int64_t n, V* out,
                            int64_t out_width, bool* found) {
  const int64_t i = thread_index();
  if (i >= n) return;
  const int64_t slot = find_slot<P>(t, keys[i]);
  found[i] = slot >= 0;
  if (slot >= 0) copy_row(t.row(slot), out + i * out_width, out_width);
}

template <class V>
__global__ void find_slots_kernel(TableRef<V> t, const int64_t* keys, int64_t n,
                                  int64_t* slots) {
  const int64_t i = thread_index();
  if (i < n) slots[i] = find_slot<P>(t, keys[i]);
}

template <class V>
__global__ void erase_kernel(TableRef<V> t, const int64_t* keys, int64_t n, bool* erased) {
  const int64_t i = thread_index();
  if (i < n) erased[i] = erase_key<P>(t, keys[i]);
}

template <class V>
__global__ void rehash_kernel(TableRef<V> src, TableRef<V> dst, int window,
                              unsigned long long* failed) {
  const int64_t s = thread_index();
  if (s >= src.num_slots() || src.digests[s] == kEmptyDigest) return;
  const uint64_t score = src.scores ? src.scores[s] : 0;
  const uint64_t stamp = src.timestamps ? src.timestamps[s] : 0;
  const int64_t slot = place_moved<P>(dst, src.keys[s], score, stamp, window);
  if (slot < 0) {
    atomicAdd(failed, 1ULL);
    return;
  }
  copy_row(src.row(s), dst.row(slot), src.row_width);
}

}  // namespace

template <class V>
void launch_find(const TableRef<V>& t, const int64_t* keys, int64_t n, V* out, int64_t out_width,
                 bool* found, cudaStream_t stream) {
  if (n > 0) find_kernel<<<blocks_for(n), kBlock, 0, stream>>>(t, keys, n, out, out_width, found);
}

template <class V>
void launch_find_slots(const TableRef<V>& t, const int64_t* keys, int64_t n, int64_t* slots,
                       cudaStream_t stream) {
  if (n > 0) find_slots_kernel<<<blocks_for(n), kBlock, 0, stream>>>(t, keys, n, slots);
}

template <class V>
void launch_find_or_insert(const FindOrInsertSink<V>& sink, const UpsertArgs& args,
                           const int64_t* keys, int64_t n, int8_t* status, int64_t* counts,
                           cudaStream_t stream) {
  launch_upsert<V>(sink, args, keys, n, status, counts, stream);
}

template <class V>
void launch_assign(const AssignSink<V>& sink, const UpsertArgs& args, const int64_t* keys,
                   int64_t n, int8_t* status, int64_t* counts, cudaStream_t stream) {
  launch_upsert<V>(sink, args, keys, n, status, counts, stream);
}

template <class V>
void launch_restore(const RestoreSink<V>& sink, const UpsertArgs& args, const int64_t* keys,
                    int64_t n, int8_t* status, int64_t* counts, cudaStream_t stream) {
  launch_upsert<V>(sink, args, keys, n, status, counts, stream);
}

template <class V>
void launch_erase(const TableRef<V>& t, const int64_t* keys, int64_t n, bool* erased,
                  cudaStream_t stream) {
  if (n > 0) erase_kernel<<<blocks_for(n), kBlock, 0, stream>>>(t, keys, n, erased);
}

template <class V>
void launch_rehash(const TableRef<V>& src, const TableRef<V>& dst, int window, int64_t* failed,
                   cudaStream_t stream) {
  cudaMemsetAsync(failed, 0, sizeof(int64_t), stream);
  const int64_t slots = src.num_slots();
  if (slots > 0) {
    rehash_kernel<<<blocks_for(slots), kBlock, 0, stream>>>(
        src, dst, window, reinterpret_cast<unsigned long long*>(failed));
  }
}

#define DYNEMB_INSTANTIATE(V)                                                                   \
  template void launch_find<V>(const TableRef<V>&, const int64_t*, int64_t, V*, int64_t, bool*, \
                               cudaStream_t);                                                   \
  template void launch_find_slots<V>(const TableRef<V>&, const int64_t*, int64_t, int64_t*,     \
                                     cudaStream_t);                                             \
  template void launch_find_or_insert<V>(const FindOrInsertSink<V>&, const UpsertArgs&,         \
                                         const int64_t*, int64_t, int8_t*, int64_t*,            \
                                         cudaStream_t);                                         \
  template void launch_assign<V>(const AssignSink<V>&, const UpsertArgs&, const int64_t*,       \
                                 int64_t, int8_t*, int64_t*, cudaStream_t);                     \
  template void launch_restore<V>(const RestoreSink<V>&, const UpsertArgs&, const int64_t*,     \
                                  int64_t, int8_t*, int64_t*, cudaStream_t);                    \
  template void launch_erase<V>(const TableRef<V>&, const int64_t*, int64_t, bool*,             \
                                cudaStream_t);                                                  \
  template void launch_rehash<V>(const TableRef<V>&, const TableRef<V>&, int, int64_t*,         \
                                 cudaStream_t);

DYNEMB_INSTANTIATE(float)
DYNEMB_INSTANTIATE(__half)
DYNEMB_INSTANTIATE(__nv_bfloat16)

}  // namespace dynemb::cuda
