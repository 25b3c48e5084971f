// dynemb torch layer: CPU implementations of the ops declared in ops.cpp.
// Each op checks every argument (before anything changes), builds a TableRef and
// calls the CPU executor.
#include <ATen/ATen.h>
#include <torch/library.h>

#include "cpu/executor_cpu.h"
#include "torch/op_args.h"
#include "torch/tensor_checks.h"

namespace dynemb {
namespace {

template <class F>
decltype(auto) dispatch_values(const char* op, const at::Tensor& values, F&& f) {
  switch (values.scalar_type()) {
    case at::kFloat: return f(float{});
    case at::kHalf: return f(c10::Half{});
    case at::kBFloat16: return f(c10::BFloat16{});
    default:
      TORCH_CHECK_TYPE(false, "dynemb.", op,
                       ": table values must be float32, float16 or bfloat16, got ",
                       values.scalar_type());
  }
}

std::tuple<at::Tensor, at::Tensor> hash_keys_cpu(const at::Tensor& keys, int64_t num_buckets) {
  check_keys("hash_keys", keys);
  TORCH_CHECK_VALUE(num_buckets >= 1 && num_buckets <= (int64_t{1} << 32),
                    "dynemb.hash_keys: `num_buckets` must be in [1, 2^32], got ", num_buckets);
  at::Tensor bucket = at::empty_like(keys);
  at::Tensor digest = at::empty(keys.sizes(), keys.options().dtype(at::kByte));
  cpu::hash_keys(keys.data_ptr<int64_t>(), keys.numel(), num_buckets,
                 bucket.data_ptr<int64_t>(), digest.data_ptr<uint8_t>());
  return {bucket, digest};
}

at::Tensor table_find_cpu(at::TensorList table, const at::Tensor& keys, const at::Tensor& values) {
  constexpr const char* op = "table_find";
  check_table(op, table);
  check_keys(op, keys);
  check_rows(op, "values", values, table[4], keys.numel(), 1, table[4].size(1));
  at::Tensor found = at::empty(keys.sizes(), keys.options().dtype(at::kBool));
  dispatch_values(op, table[4], [&](auto v) {
    using V = decltype(v);
    cpu::find(table_ref<V>(table), keys.data_ptr<int64_t>(), keys.numel(),
              reinterpret_cast<V*>(values.data_ptr()), values.size(1), found.data_ptr<bool>());
  });
  return found;
}

at::Tensor table_find_slots_cpu(at::TensorList table, const at::Tensor& keys) {
  constexpr const char* op = "table_find_slots";
  check_table(op, table);
  check_keys(op, keys);
  at::Tensor slots = at::empty_like(keys);
  dispatch_values(op, table[4], [&](auto v) {
    using V = decltype(v);
    cpu::find_slots(table_ref<V>(table), keys.data_ptr<int64_t>(), keys.numel(),
                    slots.data_ptr<int64_t>());
  });
  return slots;
}

std::tuple<at::Tensor, at::Tensor> table_find_or_insert_cpu(
    at::TensorList table, at::IntArrayRef policy, at::ArrayRef<double> init,
    const at::Tensor& keys, const std::optional<at::Tensor>& scores, const at::Tensor& values,
    at::TensorList evicted) {
  constexpr const char* op = "table_find_or_insert";
  const UpsertCall call = check_upsert(op, table, policy, init, keys, scores, evicted);
  check_rows(op, "values", values, table[4], keys.numel(), 1, table[4].size(1));
  return dispatch_values(op, table[4], [&](auto v) {
    using V = decltype(v);
    FindOrInsertSink<V> sink{table_ref<V>(table), call.init, call.dim,
                             reinterpret_cast<V*>(values.data_ptr()), values.size(1),
                             evicted_out<V>(evicted)};
    return finish_upsert(keys, [&](int8_t* status) {
      return cpu::find_or_insert(sink, call.args, keys.data_ptr<int64_t>(), keys.numel(), status);
    });
  });
}

std::tuple<at::Tensor, at::Tensor> table_insert_or_assign_cpu(
    at::TensorList table, at::IntArrayRef policy, at::ArrayRef<double> init,
    const at::Tensor& keys, const std::optional<at::Tensor>& scores, const at::Tensor& values,
    at::TensorList evicted) {
  constexpr const char* op = "table_insert_or_assign";
  const UpsertCall call = check_upsert(op, table, policy, init, keys, scores, evicted);
  check_rows(op, "values", values, table[4], keys.numel(), call.dim, table[4].size(1));
  TORCH_CHECK_VALUE(values.size(1) == call.dim || values.size(1) == table[4].size(1), "dynemb.",
                    op, ": `values` must have dim=", call.dim, " or row_width=",
                    table[4].size(1), " columns, got ", values.size(1));
  return dispatch_values(op, table[4], [&](auto v) {
    using V = decltype(v);
    AssignSink<V> sink{table_ref<V>(table), call.init, call.dim,
                       reinterpret_cast<const V*>(values.data_ptr()), values.size(1),
                       evicted_out<V>(evicted)};
    return finish_upsert(keys, [&](int8_t* status) {
      return cpu::assign(sink, call.args, keys.data_ptr<int64_t>(), keys.numel(), status);
    });
  });
}

at::Tensor table_erase_cpu(at::TensorList table, const at::Tensor& keys) {
  constexpr const char* op = "table_erase";
  check_table(op, table);
  check_keys(op, keys);
  at::Tensor erased = at::empty(keys.sizes(), keys.options().dtype(at::kBool));
  dispatch_values(op, table[4], [&](auto v) {
    using V = decltype(v);
    cpu::erase(table_ref<V>(table), keys.data_ptr<int64_t>(), keys.numel(),
               erased.data_ptr<bool>());
  });
  return erased;
}

int64_t table_rehash_cpu(at::TensorList src, at::TensorList dst, int64_t window) {
  constexpr const char* op = "table_rehash";
  check_table(op, src);
  check_table(op, dst);
  TORCH_CHECK_VALUE(src[4].scalar_type() == dst[4].scalar_type() &&
                        src[4].size(1) == dst[4].size(1) &&
                        src[2].numel() == 0 == (dst[2].numel() == 0) &&
                        src[3].numel() == 0 == (dst[3].numel() == 0),
                    "dynemb.", op, ": `src` and `dst` must have the same row layout and scores");
  TORCH_CHECK_VALUE(window >= 1 && window <= kMaxProbeBuckets, "dynemb.", op,
                    ": `window` must be in [1, ", kMaxProbeBuckets, "], got ", window);
  return dispatch_values(op, src[4], [&](auto v) {
    using V = decltype(v);
    return cpu::rehash(table_ref<V>(src), table_ref<V>(dst), static_cast<int>(window));
  });
}

}  // namespace

TORCH_LIBRARY_IMPL(dynemb, CPU, m) {
  m.impl("hash_keys", &hash_keys_cpu);
  m.impl("table_find", &table_find_cpu);
  m.impl("table_find_slots", &table_find_slots_cpu);
  m.impl("table_find_or_insert", &table_find_or_insert_cpu);
  m.impl("table_insert_or_assign", &table_insert_or_assign_cpu);
  m.impl("table_erase", &table_erase_cpu);
  m.impl("table_rehash", &table_rehash_cpu);
}

}  // namespace dynemb
