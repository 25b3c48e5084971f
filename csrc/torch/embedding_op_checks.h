// dynemb torch layer: the argument checks of the embedding ops (embedding_op_impls.h,
// cache_op_impls.h) and the checked arguments they hand to a Backend.
#pragma once

#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

#include "core/grouped.h"
#include "core/pooling.h"
#include "torch/table_op_impls.h"

namespace dynemb {

inline InitArgs parse_missing(const char* op, at::ArrayRef<double> missing, int64_t seed) {
  return parse_init(op, "missing", missing, seed);
}

inline PoolingMode parse_pooling(const char* op, int64_t mode) {
  TORCH_CHECK_VALUE(mode >= 0 && mode < kPoolingModeCount, "dynemb.", op,
                    ": `mode` must be 0 (SUM) or 1 (MEAN), got ", mode);
  return static_cast<PoolingMode>(mode);
}

/// Checks that read tensor values (ranges, offsets) run on host tensors always, and on
/// a GPU only in safe-check mode (environment DYNEMB_SAFE_CHECKS=1, read once): reading
/// device values synchronises the host with the stream. Shape, dtype, device and
/// contiguity checks always run.
inline bool reads_values(const at::Tensor& t) {
  static const bool safe_checks = [] {
    const char* v = std::getenv("DYNEMB_SAFE_CHECKS");
    return v != nullptr && std::string(v) == "1";
  }();
  return t.is_cpu() || safe_checks;
}

/// values (n) int64 all in [lowest, end); `what` names them in the message (slots, ids).
inline void check_range(const char* op, const char* name, const char* what,
                        const at::Tensor& values, int64_t lowest, int64_t end) {
  if (values.numel() == 0 || !reads_values(values)) return;
  int64_t lo, hi;
  if (values.is_cpu() && values.is_contiguous()) {
    // One pass in this (vectorised) loop: at::aminmax's int64 kernel took ~2 ns an
    // element here, 4% of a W-train-wide step for the inverse lists of pool and backward.
    const int64_t* v = values.data_ptr<int64_t>();
    lo = hi = v[0];
    for (int64_t i = 1, n = values.numel(); i < n; ++i) {
      lo = std::min(lo, v[i]);
      hi = std::max(hi, v[i]);
    }
  } else {
    const auto range = at::aminmax(values);
    lo = std::get<0>(range).item<int64_t>();
    hi = std::get<1>(range).item<int64_t>();
  }
  TORCH_CHECK_VALUE(lo >= lowest && hi < end, "dynemb.", op, ": `", name, "` must hold ", what, " in [",
                    lowest, ", ", end, "), got values in [", lo, ", ", hi, "]");
}

/// offsets (num_bags + 1): start at 0, never decrease, end at n.
inline void check_offsets(const char* op, const at::Tensor& offsets, int64_t n) {
  if (!reads_values(offsets)) return;
  const at::Tensor host = offsets.cpu();
  const int64_t* o = host.data_ptr<int64_t>();
  const int64_t m = host.numel();
  TORCH_CHECK_VALUE(o[0] == 0, "dynemb.", op, ": `offsets` must start at 0, got ", o[0]);
  for (int64_t b = 1; b < m; ++b) {
    TORCH_CHECK_VALUE(o[b] >= o[b - 1], "dynemb.", op, ": `offsets` must never decrease, got ",
                      "offsets[", b, "]=", o[b], " < offsets[", b - 1, "]=", o[b - 1]);
  }
  TORCH_CHECK_VALUE(o[m - 1] == n, "dynemb.", op, ": `offsets` must end at the number of ",
                    "indices ", n, ", got ", o[m - 1]);
}

/// Checks `slots` (n) int64 (named `name`: slots of the table, -1 for none, or another
/// per-index list), keys (n) int64, offsets (num_bags + 1) int64 from 0 to n, weights
/// (n) float, all on the table's device.
inline void check_bags(const char* op, const at::Tensor& table0, const char* name,
                       const at::Tensor& slots, const at::Tensor* keys,
                       const at::Tensor& offsets, const std::optional<at::Tensor>& weights) {
  check_tensor(op, name, slots, at::kLong, 1);
  check_same_device(op, name, slots, table0);
  if (keys != nullptr) {
    check_tensor(op, "keys", *keys, at::kLong, 1);
    TORCH_CHECK_VALUE(keys->numel() == slots.numel(), "dynemb.", op, ": `keys` has ",
                      keys->numel(), " elements, `", name, "` has ", slots.numel());
    check_same_device(op, "keys", *keys, table0);
  }
  check_tensor(op, "offsets", offsets, at::kLong, 1);
  TORCH_CHECK_VALUE(offsets.numel() >= 1, "dynemb.", op, ": `offsets` must not be empty");
  check_same_device(op, "offsets", offsets, table0);
  check_offsets(op, offsets, slots.numel());
  if (weights.has_value()) {
    check_tensor(op, "weights", *weights, at::kFloat, 1);
    TORCH_CHECK_VALUE(weights->numel() == slots.numel(), "dynemb.", op, ": `weights` has ",
                      weights->numel(), " elements, `", name, "` has ", slots.numel());
    check_same_device(op, "weights", *weights, table0);
  }
}

/// slots: (n) int64 slots of `table0`'s table, each in [lowest, num_slots) (lowest
/// -1: a key without a slot).
inline void check_slot_list(const char* op, const char* name, const at::Tensor& slots,
                            const at::Tensor& table0, int64_t lowest = 0) {
  check_tensor(op, name, slots, at::kLong, 1);
  check_same_device(op, name, slots, table0);
  check_range(op, name, "slots", slots, lowest, table0.numel());
}

/// Checks `matrix` (B, width) float32 with unit column stride and `columns` (K >= 1)
/// int64 on the table's device, num_bags == K * B and every column in [0, width - dim]:
/// bag b of the op is row b % B, columns[b / B] (core/pooling.h BagRows).
inline void check_bag_columns(const char* op, const char* name, const at::Tensor& matrix,
                              const at::Tensor& columns, int64_t num_bags, int64_t dim,
                              const at::Tensor& table0) {
  TORCH_CHECK_TYPE(matrix.scalar_type() == at::kFloat, "dynemb.", op, ": `", name,
                   "` must be float32, got ", matrix.scalar_type());
  TORCH_CHECK_VALUE(matrix.dim() == 2 &&
                        (matrix.numel() == 0 || matrix.size(1) == 1 || matrix.stride(1) == 1),
                    "dynemb.", op, ": `", name,
                    "` must be 2-D with contiguous rows, got shape ", matrix.sizes(),
                    " and strides ", matrix.strides());
  check_same_device(op, name, matrix, table0);
  check_tensor(op, "columns", columns, at::kLong, 1);
  check_same_device(op, "columns", columns, table0);
  const int64_t k = columns.numel(), rows = matrix.size(0);
  TORCH_CHECK_VALUE(k >= 1 && num_bags == k * rows, "dynemb.", op, ": `columns` (", k,
                    " features) and `", name, "` (", rows, " rows) must give one place per bag (",
                    num_bags, " bags), got ", k, " x ", rows);
  check_range(op, "columns", "column offsets", columns, 0, matrix.size(1) - dim + 1);
}

/// BagRows over a checked (matrix, columns) pair.
template <class F>
BagRows<F> bag_columns(F* base, const at::Tensor& matrix, const at::Tensor& columns) {
  return BagRows<F>{base, matrix.stride(0), columns.data_ptr<int64_t>(), matrix.size(0)};
}

/// A claim's keys that move into the cache (core moves_in), compact: their positions
/// (m,), each one's victim index (m,; -1: no victim), the victim count, and how many
/// of them lack a slot (an error: their claim reported none). Where the caller gave
/// the counts and the backend did not read the device's (`counted` false), m and
/// victims are the caller's, without_slot is 0 and `device_counts` (moved, victims)
/// holds the device's, which bound the exchange (core CacheExchange::device_counts).
struct CacheMoves {
  at::Tensor moved;
  at::Tensor victim_index;
  int64_t victims;
  int64_t without_slot;
  bool counted = true;
  at::Tensor device_counts;
};

/// One table's checked pooling arguments (a part of a pooling call).
struct PoolArgs {
  TableTensors table;
  const at::Tensor& slots;
  const at::Tensor* inverse;  // null: slots per index; else slots per distinct key
  const at::Tensor& keys;
  const at::Tensor& offsets;
  const float* weights;
  InitArgs missing;
  int64_t num_bags;
  int64_t dim;
};

/// One table's checked backward arguments (a part of a backward call).
struct BackwardArgs {
  TableTensors table;
  const at::Tensor& unique_slots;
  const at::Tensor& inverse;
  const at::Tensor& offsets;
  const float* weights;
  BagRows<const float> grad;
  int64_t num_bags;
  int64_t dim;
};

/// The name of table t of a grouped op in its messages: "op, table t".
inline std::string table_op_name(const char* op, size_t t) {
  return std::string(op) + ", table " + std::to_string(t);
}

/// A grouped op's per-table lists: `name` must hold `expected` entries (T tables).
inline void check_list_size(const char* op, const char* name, size_t size, size_t expected,
                            size_t tables) {
  TORCH_CHECK_VALUE(size == expected, "dynemb.", op, ": `", name, "` must hold ", expected,
                    " entries for ", tables, " tables, got ", size);
}

/// `dim` (the columns an op reads or writes) in [1, the table's row width].
inline void check_dim(const char* op, const TableTensors& table, int64_t dim) {
  TORCH_CHECK_VALUE(dim >= 1 && dim <= table.row_width(), "dynemb.", op, ": `dim` ", dim,
                    " must be in [1, row_width=", table.row_width(), "]");
}

}  // namespace dynemb
