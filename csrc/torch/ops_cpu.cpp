// dynemb torch layer: CPU registration of the ops declared in ops.cpp.
#include <torch/library.h>

#include "cpu/embedding_cpu.h"
#include "cpu/executor_cpu.h"
#include "torch/embedding_op_impls.h"
#include "torch/table_op_impls.h"

namespace dynemb {
namespace {

/// The Backend of table_op_impls.h that runs the CPU executor.
struct CpuBackend {
  template <class TorchV>
  using Value = TorchV;
  struct DeviceGuard {
    explicit DeviceGuard(at::Device) {}
  };

  static void hash_keys(const int64_t* keys, int64_t n, int64_t num_buckets, int64_t* bucket,
                        uint8_t* digest) {
    cpu::hash_keys(keys, n, num_buckets, bucket, digest);
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
  template <class V>
  static void find_or_insert(const FindOrInsertSink<V>& sink, const UpsertArgs& args,
                             const int64_t* keys, int64_t n, int8_t* status, at::Tensor& counts) {
    store_counts(cpu::upsert_keys(sink, args, keys, n, status), counts);
  }
  template <class V>
  static void assign(const AssignSink<V>& sink, const UpsertArgs& args, const int64_t* keys,
                     int64_t n, int8_t* status, at::Tensor& counts) {
    store_counts(cpu::upsert_keys(sink, args, keys, n, status), counts);
  }
  template <class V>
  static void restore(const RestoreSink<V>& sink, const UpsertArgs& args, const int64_t* keys,
                      int64_t n, int8_t* status, at::Tensor& counts) {
    store_counts(cpu::upsert_keys(sink, args, keys, n, status), counts);
  }
  template <class V>
  static void erase(const TableRef<V>& t, const int64_t* keys, int64_t n, bool* erased) {
    cpu::erase(t, keys, n, erased);
  }
  template <class V>
  static int64_t rehash(const TableRef<V>& src, const TableRef<V>& dst, int window) {
    return cpu::rehash(src, dst, window);
  }

  template <class V>
  static void find_or_insert_slots(const SlotSink<V>& sink, const UpsertArgs& args,
                                   const int64_t* keys, int64_t n, int8_t* status,
                                   at::Tensor& counts) {
    store_counts(cpu::upsert_keys(sink, args, keys, n, status), counts);
  }
  template <class V>
  static void pool(const TableRef<V>& t, const int64_t* slots, const int64_t* keys,
                   const int64_t* offsets, int64_t num_bags, const float* weights,
                   PoolingMode mode, const InitArgs& missing, float* out, int64_t dim) {
    cpu::pool(t, slots, keys, offsets, num_bags, weights, mode, missing, out, dim);
  }
  template <class V>
  static void gather(const TableRef<V>& t, const int64_t* slots, const int64_t* keys, int64_t n,
                     const InitArgs& missing, float* out, int64_t dim) {
    cpu::gather(t, slots, keys, n, missing, out, dim);
  }
  static int64_t dedup(const int64_t* keys, int64_t n, int64_t* unique, int64_t* inverse,
                       int64_t* counts) {
    return cpu::dedup(keys, n, unique, inverse, counts);
  }
  template <class V>
  static void backward(const TableRef<V>& t, const int64_t* unique_slots, int64_t num_unique,
                       const int64_t* inverse, const int64_t* offsets, int64_t num_bags,
                       const float* weights, PoolingMode mode, const float* grad, int64_t dim,
                       const OptimizerArgs& opt) {
    cpu::backward_update(t, unique_slots, num_unique, inverse, offsets, num_bags, weights, mode,
                         grad, dim, opt);
  }
  template <class V>
  static void cache_exchange(const TableRef<V>& cache, const TableRef<V>& slow,
                             const CacheExchange<V>& x) {
    cpu::cache_exchange(cache, slow, x);
  }
  static CacheMoves cache_moves(const at::Tensor& status, const at::Tensor& slots) {
    const int64_t n = status.numel();
    at::Tensor moved = at::empty({n}, slots.options());
    at::Tensor victim_index = at::empty({n}, slots.options());
    const int8_t* s = status.data_ptr<int8_t>();
    const int64_t* slot = slots.data_ptr<int64_t>();
    int64_t* position = moved.data_ptr<int64_t>();
    int64_t* victim = victim_index.data_ptr<int64_t>();
    int64_t m = 0, victims = 0, without_slot = 0;
    for (int64_t i = 0; i < n; ++i) {  // ~1 ns a key: not worth threads
      if (!moves_in(s[i])) continue;
      position[m] = i;
      victim[m] = evicts_resident(s[i]) ? victims++ : -1;
      without_slot += slot[i] < 0;
      ++m;
    }
    return {moved.narrow(0, 0, m), victim_index.narrow(0, 0, m), victims, without_slot};
  }

 private:
  static void store_counts(const StatusCounts& done, at::Tensor& counts) {
    for (int k = 0; k < 4; ++k) counts.data_ptr<int64_t>()[k] = done.by_status[k];
  }
};

}  // namespace

TORCH_LIBRARY_IMPL(dynemb, CPU, m) {
  DYNEMB_REGISTER_TABLE_OPS(m, CpuBackend);
  DYNEMB_REGISTER_EMBEDDING_OPS(m, CpuBackend);
}

}  // namespace dynemb
