// dynemb torch layer: CUDA registration of the ops declared in ops.cpp.
// Compiled only when DYNEMB_WITH_CUDA=1 with a CUDA build of torch (setup.py);
// it cannot be built or run on our CPU-only machines. It only maps torch types
// to the torch-free launchers of csrc/cuda and passes the current stream.
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <torch/library.h>

#include <type_traits>

#include "cuda/launchers_cuda.h"
#include "torch/embedding_op_impls.h"
#include "torch/table_op_impls.h"

namespace dynemb {
namespace {

cudaStream_t stream() { return c10::cuda::getCurrentCUDAStream().stream(); }

/// The Backend of table_op_impls.h that launches the CUDA executor.
struct CudaBackend {
  template <class TorchV>
  using Value = std::conditional_t<
      std::is_same_v<TorchV, c10::Half>, __half,
      std::conditional_t<std::is_same_v<TorchV, c10::BFloat16>, __nv_bfloat16, TorchV>>;
  using DeviceGuard = c10::cuda::CUDAGuard;

  static void hash_keys(const int64_t* keys, int64_t n, int64_t num_buckets, int64_t* bucket,
                        uint8_t* digest) {
    cuda::launch_hash_keys(keys, n, num_buckets, bucket, digest, stream());
  }
  template <class V>
  static void find(const TableRef<V>& t, const int64_t* keys, int64_t n, V* out,
                   int64_t out_width, bool* found) {
    cuda::launch_find(t, keys, n, out, out_width, found, stream());
  }
  template <class V>
  static void find_slots(const TableRef<V>& t, const int64_t* keys, int64_t n, int64_t* slots) {
    cuda::launch_find_slots(t, keys, n, slots, stream());
  }
  template <class V>
  static void find_or_insert(const FindOrInsertSink<V>& sink, const UpsertArgs& args,
                             const int64_t* keys, int64_t n, int8_t* status, at::Tensor& counts) {
    cuda::launch_find_or_insert(sink, args, keys, n, status, counts.data_ptr<int64_t>(), stream());
  }
  template <class V>
  static void assign(const AssignSink<V>& sink, const UpsertArgs& args, const int64_t* keys,
                     int64_t n, int8_t* status, at::Tensor& counts) {
    cuda::launch_assign(sink, args, keys, n, status, counts.data_ptr<int64_t>(), stream());
  }
  template <class V>
  static void restore(const RestoreSink<V>& sink, const UpsertArgs& args, const int64_t* keys,
                      int64_t n, int8_t* status, at::Tensor& counts) {
    cuda::launch_restore(sink, args, keys, n, status, counts.data_ptr<int64_t>(), stream());
  }
  template <class V>
  static void erase(const TableRef<V>& t, const int64_t* keys, int64_t n, bool* erased) {
    cuda::launch_erase(t, keys, n, erased, stream());
  }
  template <class V>
  static void find_or_insert_slots(const SlotSink<V>& sink, const UpsertArgs& args,
                                   const int64_t* keys, int64_t n, int8_t* status,
                                   at::Tensor& counts) {
    cuda::launch_find_or_insert_slots(sink, args, keys, n, status, counts.data_ptr<int64_t>(),
                                      stream());
  }
  template <class V>
  static void pool(const TableRef<V>& t, const int64_t* slots, const int64_t* keys,
                   const int64_t* offsets, int64_t num_bags, const float* weights,
                   PoolingMode mode, const InitArgs& missing, float* out, int64_t dim) {
    cuda::launch_pool(t, slots, keys, offsets, num_bags, weights, mode, missing, out, dim,
                      stream());
  }
  template <class V>
  static void gather(const TableRef<V>& t, const int64_t* slots, const int64_t* keys, int64_t n,
                     const InitArgs& missing, float* out, int64_t dim) {
    cuda::launch_gather(t, slots, keys, n, missing, out, dim, stream());
  }
  static int64_t dedup(const int64_t* keys, int64_t n, int64_t* unique, int64_t* inverse,
                       int64_t* counts) {
    int64_t capacity = 16;
    while (capacity < 2 * n) capacity <<= 1;
    const auto opts = at::TensorOptions().device(at::kCUDA);
    at::Tensor cell_keys = at::empty({capacity}, opts.dtype(at::kLong));
    at::Tensor cell_uids = at::full({capacity}, -1, opts.dtype(at::kInt));
    at::Tensor num_unique = at::empty({1}, opts.dtype(at::kInt));
    cuda::launch_dedup(keys, n, cell_keys.data_ptr<int64_t>(), cell_uids.data_ptr<int32_t>(),
                       capacity, num_unique.data_ptr<int32_t>(), unique, inverse, counts,
                       stream());
    return num_unique.item<int32_t>();
  }
  template <class V>
  static void backward(const TableRef<V>& t, const int64_t* unique_slots, int64_t num_unique,
                       const int64_t* inverse, const int64_t* offsets, int64_t num_bags,
                       const float* weights, PoolingMode mode, const float* grad, int64_t dim,
                       const OptimizerArgs& opt) {
    at::Tensor acc = at::empty({num_unique, dim},
                               at::TensorOptions().device(at::kCUDA).dtype(at::kFloat));
    cuda::launch_backward(t, unique_slots, num_unique, inverse, offsets, num_bags, weights, mode,
                          grad, dim, opt, acc.data_ptr<float>(), stream());
  }
  template <class V>
  static void cache_exchange(const TableRef<V>& cache, const TableRef<V>& slow,
                             const CacheExchange<V>& x) {
    cuda::launch_cache_exchange(cache, slow, x, stream());
  }
  static CacheMoves cache_moves(const at::Tensor& status, const at::Tensor& slots) {
    const auto flags = status.options().dtype(at::kBool);
    at::Tensor moves_in = at::empty(status.sizes(), flags);
    at::Tensor evicted = at::empty(status.sizes(), flags);
    cuda::launch_cache_move_flags(status.data_ptr<int8_t>(), status.numel(),
                                  moves_in.data_ptr<bool>(), evicted.data_ptr<bool>(), stream());
    const at::Tensor moved = at::nonzero(moves_in).view(-1);
    const at::Tensor moved_evicted = evicted.index_select(0, moved);
    const at::Tensor victim_index =
        at::where(moved_evicted, at::cumsum(moved_evicted, 0, at::kLong) - 1,
                  at::full({}, -1, slots.options()));
    return {moved, victim_index, moved_evicted.sum().item<int64_t>(),
            (slots.index_select(0, moved) < 0).sum().item<int64_t>()};
  }
  template <class V>
  static int64_t rehash(const TableRef<V>& src, const TableRef<V>& dst, int window) {
    at::Tensor failed = at::empty({1}, at::TensorOptions().dtype(at::kLong).device(at::kCUDA));
    cuda::launch_rehash(src, dst, window, failed.data_ptr<int64_t>(), stream());
    return failed.item<int64_t>();
  }
};

}  // namespace

TORCH_LIBRARY_IMPL(dynemb, CUDA, m) {
  DYNEMB_REGISTER_TABLE_OPS(m, CudaBackend);
  DYNEMB_REGISTER_EMBEDDING_OPS(m, CudaBackend);
}

}  // namespace dynemb
