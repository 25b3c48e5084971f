// dynemb torch layer: CUDA registration of the ops declared in ops.cpp.
// Compiled only when DYNEMB_WITH_CUDA=1 with a CUDA build of torch (setup.py);
// it cannot be built or run on our CPU-only machines. It only maps torch types
// to the torch-free launchers of csrc/cuda and passes the current stream.
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <torch/library.h>

#include <type_traits>

#include "cuda/launchers_cuda.h"
#include "torch/embedding_op_impls.h"
#include "torch/table_op_impls.h"

namespace dynemb {
namespace {

cudaStream_t stream() { return at::cuda::getCurrentCUDAStream().stream(); }

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
  template <class V>
  static int64_t backward(const TableRef<V>& t, const int64_t* slots, const int64_t* offsets,
                          int64_t num_bags, const float* weights, PoolingMode mode,
                          const float* grad, int64_t dim, const OptimizerArgs& opt,
                          int32_t* uid_scratch) {
    int64_t n = 0;  // offsets[num_bags], read from the device
    cudaMemcpyAsync(&n, offsets + num_bags, sizeof(int64_t), cudaMemcpyDeviceToHost, stream());
    cudaStreamSynchronize(stream());
    const auto opts = at::TensorOptions().device(at::kCUDA);
    at::Tensor uid = at::empty({n}, opts.dtype(at::kInt));
    at::Tensor unique_slots = at::empty({n}, opts.dtype(at::kLong));
    at::Tensor acc = at::empty({n, dim}, opts.dtype(at::kFloat));
    at::Tensor num_unique = at::empty({1}, opts.dtype(at::kInt));
    const cuda::BackwardScratch scratch{uid_scratch, uid.data_ptr<int32_t>(),
                                        unique_slots.data_ptr<int64_t>(), acc.data_ptr<float>(),
                                        num_unique.data_ptr<int32_t>()};
    cuda::launch_backward(t, slots, offsets, num_bags, n, weights, mode, grad, dim, opt, scratch,
                          stream());
    return num_unique.item<int32_t>();
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
