// dynemb torch layer: CPU registration of the ops declared in ops.cpp.
#include <torch/library.h>

#include "cpu/dedup_cpu.h"
#include "cpu/embedding_cpu.h"
#include "cpu/executor_cpu.h"
#include "cpu/quantized_cpu.h"
#include "torch/embedding_op_impls.h"
#include "torch/quantized_op_impls.h"
#include "torch/slot_op_impls.h"
#include "torch/table_op_impls.h"

namespace dynemb {
namespace {

/// The Backend of table_op_impls.h that runs the CPU executor.
struct CpuBackend {
  template <class TorchV>
  using Value = TorchV;
  static constexpr bool kDeviceMemory = false;  // its tensors' values are the host's to read
  struct DeviceGuard {
    explicit DeviceGuard(at::Device) {}
  };

  static void hash_keys(const int64_t* keys, int64_t n, int64_t num_buckets, int64_t* bucket,
                        uint8_t* digest) {
    cpu::hash_keys(keys, n, num_buckets, bucket, digest);
  }
  static void scores_after_hit(const ScoreArgs& args, const uint64_t* scores, int64_t n,
                               uint64_t* out) {
    cpu::scores_after_hit(args, scores, n, out);
  }
  template <class V>
  static void find(const TableRef<V>& t, const int64_t* keys, int64_t n, V* out,
                   int64_t out_width, bool* found) {
    cpu::find(t, keys, n, out, out_width, found);
  }
  template <class V>
  static void find_slots(const TableRef<V>& t, const int64_t* keys, int64_t n, int64_t* slots) {
    cpu::find_slots(t, keys, n, slots);
  }
  template <class Sink>
  static void upsert(const Sink& sink, const UpsertArgs& args, const int64_t* keys, int64_t n,
                     int8_t* status, at::Tensor& counts, const int64_t* live = nullptr) {
    const StatusCounts done = cpu::upsert_keys(sink, args, keys, live_keys(live, n), status);
    for (int k = 0; k < kStatusCount; ++k) counts.data_ptr<int64_t>()[k] = done.by_status[k];
  }
  /// Each part's table in turn, its keys split among the threads by bucket range.
  template <class V>
  static void upsert_grouped(const std::vector<UpsertPart<V>>& parts, const PartTotals&,
                             int8_t*, const at::TensorOptions&) {
    for (const UpsertPart<V>& q : parts) {
      const StatusCounts done = cpu::upsert_keys(q.sink, q.args, q.keys, q.n, q.status);
      for (int k = 0; k < kStatusCount; ++k) q.counts[k] = done.by_status[k];
    }
  }
  template <class V>
  static void erase(const TableRef<V>& t, const int64_t* keys, int64_t n, bool* erased,
                    const at::TensorOptions&) {
    cpu::erase(t, keys, n, erased);
  }
  template <class V>
  static int64_t rehash(const TableRef<V>& src, const TableRef<V>& dst, int window,
                        const at::TensorOptions&) {
    return cpu::rehash(src, dst, window);
  }

  template <class V>
  static void pool(const std::vector<PoolPart<V>>& parts, const PartTotals&, PoolingMode mode,
                   const at::TensorOptions&) {
    cpu::pool(parts.data(), static_cast<int64_t>(parts.size()), mode);
  }
  template <class V>
  static void gather(const TableRef<V>& t, const int64_t* slots, const int64_t* keys, int64_t n,
                     const InitArgs& missing, float* out, int64_t dim) {
    cpu::gather(t, slots, keys, n, missing, out, dim);
  }
  static void pool_quantized(const QuantizedRows& r, const int64_t* slots, const int64_t* keys,
                             const int64_t* offsets, const float* weights, int64_t num_bags,
                             PoolingMode mode, const InitArgs& missing, float* out, int64_t dim) {
    cpu::pool_quantized(r, slots, keys, offsets, weights, num_bags, mode, missing, out, dim);
  }
  static void gather_quantized(const QuantizedRows& r, const int64_t* slots, const int64_t* keys,
                               int64_t n, const InitArgs& missing, float* out, int64_t dim) {
    cpu::gather_quantized(r, slots, keys, n, missing, out, dim);
  }
  static void dedup(const std::vector<DedupPart>& parts, const PartTotals&, at::Tensor& unique,
                    at::Tensor& inverse, at::Tensor& counts, at::Tensor& num_unique) {
    cpu::dedup(parts.data(), static_cast<int64_t>(parts.size()), unique.data_ptr<int64_t>(),
               inverse.data_ptr<int64_t>(), counts.data_ptr<int64_t>(),
               num_unique.data_ptr<int64_t>());
  }
  static std::vector<int64_t> sizes_to_host(const at::Tensor& sizes) {  // host memory already
    const int64_t* s = sizes.data_ptr<int64_t>();
    return std::vector<int64_t>(s, s + sizes.numel());
  }
  template <class V>
  static void backward(const std::vector<BackwardPart<V>>& parts, const PartTotals&,
                       PoolingMode mode, const OptimizerArgs& opt, const at::TensorOptions&) {
    cpu::backward_update(parts.data(), static_cast<int64_t>(parts.size()), mode, opt);
  }
  template <class V>
  static void cache_exchange(const TableRef<V>& cache, const TableRef<V>& slow,
                             const CacheExchange<V>& x) {
    cpu::cache_exchange(cache, slow, x);
  }
  // The counts are host values here: the caller's (moved, victims) are checked, not trusted.
  static CacheMoves cache_moves(const at::Tensor& status, const at::Tensor& slots, int64_t,
                                int64_t) {
    const int64_t n = status.numel();  // ~1 ns a key: not worth threads
    at::Tensor moved = at::empty({n}, slots.options());
    at::Tensor victim_index = at::empty({n}, slots.options());
    const MoveCounts c =
        compact_moves(status.data_ptr<int8_t>(), slots.data_ptr<int64_t>(), 0, n, 0, 0,
                      moved.data_ptr<int64_t>(), victim_index.data_ptr<int64_t>());
    return {moved.narrow(0, 0, c.moved), victim_index.narrow(0, 0, c.moved), c.victims,
            c.without_slot};
  }
};

}  // namespace

TORCH_LIBRARY_IMPL(dynemb, CPU, m) {
  DYNEMB_REGISTER_TABLE_OPS(m, CpuBackend);
  DYNEMB_REGISTER_EMBEDDING_OPS(m, CpuBackend);
  DYNEMB_REGISTER_QUANTIZED_OPS(m, CpuBackend);
  DYNEMB_REGISTER_SLOT_OPS(m, CpuBackend);
}

}  // namespace dynemb
