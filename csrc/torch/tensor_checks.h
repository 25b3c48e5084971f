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
// Placement (dynemb/table/placement.py): every tensor on the table's device, except
// that on a CUDA device the slow tier is page-locked, mapped host memory that the
// kernels address directly; nothing else is accepted.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include "core/table_ref.h"

namespace dynemb {

constexpr int64_t kTableTensors = 8;
constexpr int64_t kSlowValues = 7;
constexpr const char* kTableTensorNames[kTableTensors] = {
    "table.digests", "table.keys",  "table.scores",   "table.timestamps",
    "table.values",  "table.locks", "table.overflow", "table.slow_values"};

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
  check_tensor(op, "table.keys", table[1], at::kLong, 1);
  TORCH_CHECK_VALUE(table[1].numel() == slots, "dynemb.", op, ": table.keys has ",
                    table[1].numel(), " slots, expected ", slots);
  for (int k : {2, 3}) {
    const char* name = k == 2 ? "table.scores" : "table.timestamps";
    check_tensor(op, name, table[k], at::kLong, 1);
    TORCH_CHECK_VALUE(table[k].numel() == slots || table[k].numel() == 0, "dynemb.", op, ": ",
                      name, " must have ", slots, " or 0 elements, got ", table[k].numel());
  }
  const at::Tensor& values = table[4];
  const at::Tensor& slow = table[7];
  TORCH_CHECK_VALUE(values.dim() == 2 && values.is_contiguous() && slow.dim() == 2 &&
                        slow.is_contiguous() && values.size(0) + slow.size(0) == slots &&
                        slow.size(1) == values.size(1) &&
                        slow.scalar_type() == values.scalar_type(),
                    "dynemb.", op, ": table.values and table.slow_values must be contiguous ",
                    "(rows, row_width) tensors of one dtype whose rows add up to ", slots,
                    ", got shapes ", values.sizes(), " and ", slow.sizes());
  check_tensor(op, "table.locks", table[5], at::kInt, 1);
  check_tensor(op, "table.overflow", table[6], at::kByte, 1);
  TORCH_CHECK_VALUE(table[5].numel() == num_buckets && table[6].numel() == num_buckets,
                    "dynemb.", op, ": table.locks and table.overflow must have num_buckets=",
                    num_buckets, " elements");
  for (int64_t k = 0; k < kTableTensors; ++k) {
    if (k != kSlowValues) check_same_device(op, kTableTensorNames[k], table[k], digests);
  }
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

template <class V>
TableRef<V> table_ref(at::TensorList table) {
  auto opt_u64 = [](const at::Tensor& t) {
    return t.numel() == 0 ? nullptr : reinterpret_cast<uint64_t*>(t.data_ptr<int64_t>());
  };
  TableRef<V> r;
  r.digests = table[0].data_ptr<uint8_t>();
  r.keys = table[1].data_ptr<int64_t>();
  r.scores = opt_u64(table[2]);
  r.timestamps = opt_u64(table[3]);
  r.values = reinterpret_cast<V*>(table[4].data_ptr());
  r.slow_values = table[7].numel() == 0 ? nullptr : reinterpret_cast<V*>(table[7].data_ptr());
  r.fast_slots = table[4].size(0);
  r.locks = reinterpret_cast<uint32_t*>(table[5].data_ptr<int32_t>());
  r.overflow = table[6].data_ptr<uint8_t>();
  r.num_buckets = table[0].size(0);
  r.bucket_capacity = table[0].size(1);
  r.row_width = table[4].size(1);
  return r;
}

}  // namespace dynemb
