// dynemb torch layer: argument checks shared by every backend, and the bridge
// from the op's Tensor[] table to a core TableRef.
//
// The table travels through ops as a Tensor[] in this order (dynemb/_ops.py
// builds it):
//   0 digests    (num_buckets, bucket_capacity) uint8
//   1 keys       (num_slots) int64
//   2 scores     (num_slots) or (0) int64 (read as uint64)
//   3 timestamps (num_slots) or (0) int64
//   4 values     (fast_slots, row_width) float32 | float16 | bfloat16: fast-tier rows
//   5 locks      (num_buckets) int32
//   6 overflow   (num_buckets) uint8
//   7 slow_values (num_slots - fast_slots, row_width), values' dtype: slow-tier rows
//                (0 rows for a table in one tier)
//   8 pins       (num_slots) or (0) int32 (read as uint32; core/table_ops.h "Pins")
// Placement (dynemb/table/placement.py): every tensor on the table's device, except
// that on a CUDA device the slow tier is page-locked, mapped host memory that the
// kernels address directly; nothing else is accepted.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include "core/table_ref.h"
#include "torch/op_scope.h"

namespace dynemb {

constexpr int64_t kTableTensors = 9;
constexpr int64_t kSlowValues = 7;
constexpr const char* kTableTensorNames[kTableTensors] = {
    "table.digests", "table.keys",     "table.scores",      "table.timestamps", "table.values",
    "table.locks",   "table.overflow", "table.slow_values", "table.pins"};

/// The op argument `table` by name (order above). References into the op's list:
/// valid for the op's duration.
struct TableTensors {
  const at::Tensor& digests;
  const at::Tensor& keys;
  const at::Tensor& scores;
  const at::Tensor& timestamps;
  const at::Tensor& values;
  const at::Tensor& locks;
  const at::Tensor& overflow;
  const at::Tensor& slow_values;
  const at::Tensor& pins;

  at::Device device() const { return digests.device(); }
  int64_t num_slots() const { return digests.numel(); }
  int64_t row_width() const { return values.size(1); }
};

/// Names the tensors of a `table` list that has kTableTensors entries (check_table).
inline TableTensors table_tensors(at::TensorList table) {
  return TableTensors{table[0], table[1], table[2],           table[3], table[4],
                      table[5], table[6], table[kSlowValues], table[8]};
}

inline void check_tensor(const char* op, const char* name, const at::Tensor& t,
                         at::ScalarType dtype, int64_t dim) {
  TORCH_CHECK_TYPE(t.scalar_type() == dtype, "dynemb.", op, ": `", name, "` must have dtype ",
                   dtype, ", got ", t.scalar_type());
  TORCH_CHECK_VALUE(t.dim() == dim, "dynemb.", op, ": `", name, "` must be ", dim,
                    "-D, got shape ", t.sizes());
  TORCH_CHECK_VALUE(t.is_contiguous(), "dynemb.", op, ": `", name,
                    "` must be contiguous (call .contiguous() first)");
}

inline void check_keys(const char* op, const at::Tensor& keys) {
  check_tensor(op, "keys", keys, at::kLong, 1);
}

inline void check_same_device(const char* op, const char* name, const at::Tensor& t,
                              const at::Tensor& ref) {
  TORCH_CHECK_VALUE(t.device() == ref.device(), "dynemb.", op, ": `", name, "` is on ",
                    t.device(), " but the table is on ", ref.device());
}

inline void check_table(const char* op, at::TensorList table) {
  TORCH_CHECK_VALUE(static_cast<int64_t>(table.size()) == kTableTensors, "dynemb.", op,
                    ": `table` must hold ", kTableTensors, " tensors, got ", table.size());
  const at::Tensor& digests = table[0];
  check_tensor(op, "table.digests", digests, at::kByte, 2);
  const int64_t num_buckets = digests.size(0), capacity = digests.size(1);
  const int64_t slots = num_buckets * capacity;
  TORCH_CHECK_VALUE(capacity > 0 && capacity % 16 == 0, "dynemb.", op,
                    ": bucket_capacity must be a positive multiple of 16, got ", capacity);
  TORCH_CHECK_VALUE(num_buckets >= 1 && num_buckets <= (int64_t{1} << 32), "dynemb.", op,
                    ": num_buckets must be in [1, 2^32], got ", num_buckets);
  const TableTensors t = table_tensors(table);
  check_tensor(op, "table.keys", t.keys, at::kLong, 1);
  TORCH_CHECK_VALUE(t.keys.numel() == slots, "dynemb.", op, ": table.keys has ",
                    t.keys.numel(), " slots, expected ", slots);
  for (const at::Tensor* meta : {&t.scores, &t.timestamps}) {
    const char* name = meta == &t.scores ? "table.scores" : "table.timestamps";
    check_tensor(op, name, *meta, at::kLong, 1);
    TORCH_CHECK_VALUE(meta->numel() == slots || meta->numel() == 0, "dynemb.", op, ": ", name,
                      " must have ", slots, " or 0 elements, got ", meta->numel());
  }
  const at::Tensor& values = t.values;
  const at::Tensor& slow = t.slow_values;
  TORCH_CHECK_VALUE(values.dim() == 2 && values.is_contiguous() && slow.dim() == 2 &&
                        slow.is_contiguous() && values.size(0) + slow.size(0) == slots &&
                        slow.size(1) == values.size(1) &&
                        slow.scalar_type() == values.scalar_type(),
                    "dynemb.", op, ": table.values and table.slow_values must be contiguous ",
                    "(rows, row_width) tensors of one dtype whose rows add up to ", slots,
                    ", got shapes ", values.sizes(), " and ", slow.sizes());
  check_tensor(op, "table.pins", t.pins, at::kInt, 1);
  TORCH_CHECK_VALUE(t.pins.numel() == slots || t.pins.numel() == 0, "dynemb.", op,
                    ": table.pins must have ", slots, " or 0 elements, got ", t.pins.numel());
  check_tensor(op, "table.locks", t.locks, at::kInt, 1);
  check_tensor(op, "table.overflow", t.overflow, at::kByte, 1);
  TORCH_CHECK_VALUE(t.locks.numel() == num_buckets && t.overflow.numel() == num_buckets,
                    "dynemb.", op, ": table.locks and table.overflow must have num_buckets=",
                    num_buckets, " elements");
  for (int64_t k = 0; k < kTableTensors; ++k) {
    if (k != kSlowValues) check_same_device(op, kTableTensorNames[k], table[k], digests);
  }
  record_launch_table(num_buckets, capacity, values.size(1), c10::toString(values.scalar_type()));
  if (slow.numel() == 0) return;
  if (digests.is_cuda()) {
    TORCH_CHECK_VALUE(slow.is_cpu() && slow.is_pinned(), "dynemb.", op,
                      ": `table.slow_values` of a table on ", digests.device(),
                      " must be page-locked host memory (the kernels address it directly), got ",
                      slow.is_cpu() ? "pageable host memory" : slow.device().str());
  } else {
    check_same_device(op, "table.slow_values", slow, digests);
  }
}

/// check_table, then the tensors by name.
inline TableTensors checked_table(const char* op, at::TensorList table) {
  check_table(op, table);
  return table_tensors(table);
}

template <class V>
TableRef<V> table_ref(const TableTensors& t) {
  auto opt_u64 = [](const at::Tensor& x) {
    return x.numel() == 0 ? nullptr : reinterpret_cast<uint64_t*>(x.data_ptr<int64_t>());
  };
  TableRef<V> r;
  r.digests = t.digests.data_ptr<uint8_t>();
  r.keys = t.keys.data_ptr<int64_t>();
  r.scores = opt_u64(t.scores);
  r.timestamps = opt_u64(t.timestamps);
  r.values = reinterpret_cast<V*>(t.values.data_ptr());
  r.slow_values =
      t.slow_values.numel() == 0 ? nullptr : reinterpret_cast<V*>(t.slow_values.data_ptr());
  r.fast_slots = t.values.size(0);
  r.locks = reinterpret_cast<uint32_t*>(t.locks.data_ptr<int32_t>());
  r.overflow = t.overflow.data_ptr<uint8_t>();
  r.pins = t.pins.numel() == 0 ? nullptr
                               : reinterpret_cast<uint32_t*>(t.pins.data_ptr<int32_t>());
  r.num_buckets = t.digests.size(0);
  r.bucket_capacity = t.digests.size(1);
  r.row_width = t.row_width();
  return r;
}

}  // namespace dynemb
