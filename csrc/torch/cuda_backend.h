// dynemb torch layer: the Backend of table_op_impls.h, slot_op_impls.h and
// embedding_op_impls.h that launches the CUDA executor (csrc/cuda). It maps torch
// types to the torch-free launchers, allocates their temporaries and outputs with
// torch, and reads back only the sizes an op must return (listed in
// docs/design.md, "Host synchronisation").
//
// Included by two translation units: ops_cuda.cpp (nvcc-built launchers, CUDA
// tensors) and csrc/emulated/ops_emulated.cpp (the same launchers built for the host
// by csrc/cuda/runtime.cuh, CPU tensors). A Runtime gives what differs:
//   struct Runtime {
//     static cudaStream_t stream();           // the stream to launch on
//     struct DeviceGuard { explicit DeviceGuard(at::Device); };
//     static at::Tensor host_bytes(int64_t n);  // a host staging buffer
//     static at::Tensor to_device(const at::Tensor& host, at::Device);  // enqueued copy
//     static at::Tensor to_host(const at::Tensor& device);  // waits; the emulation counts it
//   };
#pragma once

#include <ATen/ATen.h>

#include <cstring>
#include <type_traits>
#include <vector>

#include "cuda/launchers_cuda.h"
#include "cuda/launchers_quantized_cuda.h"
#include "torch/embedding_op_impls.h"
#include "torch/quantized_op_impls.h"
#include "torch/slot_op_impls.h"
#include "torch/table_op_impls.h"

namespace dynemb {

/// A launcher's Workspace from torch's allocator: byte tensors on the ops' device,
/// held until the op returns (the caching allocator reuses memory in stream order).
class TensorWorkspace final : public DYNEMB_CUDA_NS::Workspace {
 public:
  explicit TensorWorkspace(const at::TensorOptions& like) : options_(like.dtype(at::kByte)) {}
  void* bytes(int64_t n) override {
    held_.push_back(at::empty({n > 0 ? n : 1}, options_));
    return held_.back().data_ptr();
  }

 private:
  at::TensorOptions options_;
  std::vector<at::Tensor> held_;
};

template <class Runtime>
struct CudaBackend {
  template <class TorchV>
  using Value = std::conditional_t<
      std::is_same_v<TorchV, c10::Half>, __half,
      std::conditional_t<std::is_same_v<TorchV, c10::BFloat16>, __nv_bfloat16, TorchV>>;
  using DeviceGuard = typename Runtime::DeviceGuard;
  // Its tensors stand for device memory (CPU tensors under the emulation too): an op
  // reads no value of them outside safe-check mode, as on a GPU.
  static constexpr bool kDeviceMemory = true;

  static void scores_after_hit(const ScoreArgs& args, const uint64_t* scores, int64_t n,
                               uint64_t* out) {
    DYNEMB_CUDA_NS::launch_scores_after_hit(args, scores, n, out, Runtime::stream());
  }
  static void hash_keys(const int64_t* keys, int64_t n, int64_t num_buckets, int64_t* bucket,
                        uint8_t* digest) {
    DYNEMB_CUDA_NS::launch_hash_keys(keys, n, num_buckets, bucket, digest, Runtime::stream());
  }
  template <class V>
  static void find(const TableRef<V>& t, const int64_t* keys, int64_t n, V* out,
                   int64_t out_width, bool* found) {
    DYNEMB_CUDA_NS::launch_find(t, keys, n, out, out_width, found, Runtime::stream());
  }
  template <class V>
  static void find_slots(const TableRef<V>& t, const int64_t* keys, int64_t n, int64_t* slots) {
    DYNEMB_CUDA_NS::launch_find_slots(t, keys, n, slots, Runtime::stream());
  }
  template <class Sink>
  static void upsert(const Sink& sink, const UpsertArgs& args, const int64_t* keys, int64_t n,
                     int8_t* status, at::Tensor& counts, const int64_t* live = nullptr) {
    TensorWorkspace ws(counts.options());
    DYNEMB_CUDA_NS::launch_upsert_keys(sink, args, keys, n, live, status,
                                       counts.data_ptr<int64_t>(), ws, Runtime::stream());
  }
  template <class V>
  static void upsert_grouped(const std::vector<UpsertPart<V>>& parts, const PartTotals& totals,
                             int8_t* status, const at::TensorOptions& like) {
    TensorWorkspace ws(like);
    at::Tensor held;
    DYNEMB_CUDA_NS::launch_upsert_grouped(device_parts(parts, like, held), totals, status, ws,
                                          Runtime::stream());
  }
  template <class V>
  static void erase(const TableRef<V>& t, const int64_t* keys, int64_t n, bool* erased,
                    const at::TensorOptions& like) {
    TensorWorkspace ws(like);
    DYNEMB_CUDA_NS::launch_erase(t, keys, n, erased, ws, Runtime::stream());
  }
  template <class V>
  static int64_t rehash(const TableRef<V>& src, const TableRef<V>& dst, int window,
                        const at::TensorOptions& like) {
    TensorWorkspace ws(like);
    at::Tensor failed = at::empty({1}, like.dtype(at::kLong));
    DYNEMB_CUDA_NS::launch_rehash(src, dst, window, failed.data_ptr<int64_t>(), ws,
                                  Runtime::stream());
    // the caller grows again when entries did not fit
    return Runtime::to_host(failed).template item<int64_t>();
  }
  template <class V>
  static void pool(const std::vector<PoolPart<V>>& parts, const PartTotals& totals,
                   PoolingMode mode, const at::TensorOptions& like) {
    at::Tensor held;
    DYNEMB_CUDA_NS::launch_pool(device_parts(parts, like, held), totals, mode, Runtime::stream());
  }
  template <class V>
  static void gather(const TableRef<V>& t, const int64_t* slots, const int64_t* keys, int64_t n,
                     const InitArgs& missing, float* out, int64_t dim) {
    DYNEMB_CUDA_NS::launch_gather(t, slots, keys, n, missing, out, dim, Runtime::stream());
  }
  static void pool_quantized(const QuantizedRows& r, const int64_t* slots, const int64_t* keys,
                             const int64_t* offsets, const float* weights, int64_t num_bags,
                             PoolingMode mode, const InitArgs& missing, float* out, int64_t dim) {
    DYNEMB_CUDA_NS::launch_pool_quantized(r, slots, keys, offsets, weights, num_bags, mode,
                                          missing, out, dim, Runtime::stream());
  }
  static void gather_quantized(const QuantizedRows& r, const int64_t* slots, const int64_t* keys,
                               int64_t n, const InitArgs& missing, float* out, int64_t dim) {
    DYNEMB_CUDA_NS::launch_gather_quantized(r, slots, keys, n, missing, out, dim,
                                            Runtime::stream());
  }
  static void dedup(const std::vector<DedupPart>& parts, const PartTotals& totals,
                    at::Tensor& unique, at::Tensor& inverse, at::Tensor& counts,
                    at::Tensor& num_unique) {
    const at::TensorOptions like = unique.options();
    TensorWorkspace ws(like);
    at::Tensor held;
    DYNEMB_CUDA_NS::launch_dedup(device_parts(parts, like, held), totals,
                                 unique.data_ptr<int64_t>(), inverse.data_ptr<int64_t>(),
                                 counts.data_ptr<int64_t>(), num_unique.data_ptr<int64_t>(), ws,
                                 Runtime::stream());
  }
  /// Sizes of an op's outputs held on the device: one wait for all.
  static std::vector<int64_t> sizes_to_host(const at::Tensor& sizes) {
    const at::Tensor host = Runtime::to_host(sizes);
    const int64_t* s = host.data_ptr<int64_t>();
    return std::vector<int64_t>(s, s + sizes.numel());
  }
  template <class V>
  static void backward(const std::vector<BackwardPart<V>>& parts, const PartTotals& totals,
                       PoolingMode mode, const OptimizerArgs& opt, const at::TensorOptions& like) {
    TensorWorkspace ws(like);
    at::Tensor held;
    DYNEMB_CUDA_NS::launch_backward(device_parts(parts, like, held), totals, mode, opt, ws,
                                    Runtime::stream());
  }
  template <class V>
  static void cache_exchange(const TableRef<V>& cache, const TableRef<V>& slow,
                             const CacheExchange<V>& x) {
    DYNEMB_CUDA_NS::launch_cache_exchange(cache, slow, x, Runtime::stream());
  }
  /// The parts as the kernels read them: one by value (no copy), several as an array
  /// copied to the device (enqueued on the stream; `held` keeps it until the op returns,
  /// the caching allocator reuses it in stream order).
  template <class Part>
  static Parts<Part> device_parts(const std::vector<Part>& parts, const at::TensorOptions& like,
                                  at::Tensor& held) {
    const auto count = static_cast<int64_t>(parts.size());
    if (count == 1) return Parts<Part>{nullptr, parts[0], 1};
    const auto bytes = static_cast<int64_t>(parts.size() * sizeof(Part));
    at::Tensor host = Runtime::host_bytes(bytes);
    std::memcpy(host.data_ptr(), parts.data(), static_cast<size_t>(bytes));
    held = Runtime::to_device(host, like.device());
    return Parts<Part>{reinterpret_cast<const Part*>(held.data_ptr()), Part{}, count};
  }
  // Given the caller's counts (moved, victims >= 0), no read: they size the lists, and
  // the device's own counts bound the exchange (CacheMoves::device_counts).
  static CacheMoves cache_moves(const at::Tensor& status, const at::Tensor& slots,
                                int64_t moved_count, int64_t victim_count) {
    const int64_t n = status.numel();
    TensorWorkspace ws(slots.options());
    at::Tensor moved = at::empty({n}, slots.options());
    at::Tensor victim_index = at::empty({n}, slots.options());
    at::Tensor totals = at::empty({3}, slots.options());
    DYNEMB_CUDA_NS::launch_cache_moves(status.data_ptr<int8_t>(), slots.data_ptr<int64_t>(), n,
                                       moved.data_ptr<int64_t>(),
                                       victim_index.data_ptr<int64_t>(),
                                       totals.data_ptr<int64_t>(), ws, Runtime::stream());
    if (moved_count >= 0) {
      return {moved.narrow(0, 0, moved_count), victim_index.narrow(0, 0, moved_count),
              victim_count, 0, false, totals};
    }
    const at::Tensor host = Runtime::to_host(totals);  // the sizes of the outputs
    const int64_t* t = host.data_ptr<int64_t>();
    return {moved.narrow(0, 0, t[0]), victim_index.narrow(0, 0, t[0]), t[1], t[2]};
  }
};

}  // namespace dynemb
