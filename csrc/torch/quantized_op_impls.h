// dynemb torch layer: the lookups of 8-bit rows (core/quantized_rows.h), written once
// over a Backend (see table_op_impls.h for the pattern). The Backend adds:
//
//   static void pool_quantized(QuantizedRows, slots*, keys*, offsets*, weights*, num_bags,
//                              PoolingMode, InitArgs, float* out, dim);
//   static void gather_quantized(QuantizedRows, slots*, keys*, n, InitArgs, float* out, dim);
//
// A quantized table is a hash table's op tensors (`table`: its keys find the slots;
// its values are not read) and `rows` (num_slots, row_bytes) uint8: the 8-bit row of
// each slot.
#pragma once

#include <optional>

#include "core/quantized_rows.h"
#include "torch/embedding_op_checks.h"
#include "torch/op_scope.h"

namespace dynemb {

template <class Backend>
struct QuantizedOpImpls {
  static at::Tensor pool(at::TensorList table_list, const at::Tensor& rows, int64_t format,
                         const at::Tensor& slots, const at::Tensor& keys,
                         const at::Tensor& offsets, const std::optional<at::Tensor>& weights,
                         int64_t mode, at::ArrayRef<double> missing, int64_t seed, int64_t dim) {
    constexpr const char* op = "embedding_pool_quantized";
    const TableTensors table = checked_table(op, table_list);
    const QuantizedRows r = checked_rows(op, table, rows, format, dim);
    check_bags(op, table.digests, "slots", slots, &keys, offsets, weights);
    check_range(op, "slots", "slots", slots, -1, table.digests.numel());
    const PoolingMode pooling = parse_pooling(op, mode);
    const InitArgs init = parse_missing(op, missing, seed);
    typename Backend::DeviceGuard guard(table.digests.device());
    const int64_t num_bags = offsets.numel() - 1;
    at::Tensor out = at::empty({num_bags, dim}, slots.options().dtype(at::kFloat));
    Backend::pool_quantized(r, slots.data_ptr<int64_t>(), keys.data_ptr<int64_t>(),
                            offsets.data_ptr<int64_t>(),
                            weights.has_value() ? weights->data_ptr<float>() : nullptr, num_bags,
                            pooling, init, out.data_ptr<float>(), dim);
    return out;
  }

  static at::Tensor gather(at::TensorList table_list, const at::Tensor& rows, int64_t format,
                           const at::Tensor& slots, const at::Tensor& keys,
                           at::ArrayRef<double> missing, int64_t seed, int64_t dim) {
    constexpr const char* op = "embedding_gather_quantized";
    const TableTensors table = checked_table(op, table_list);
    const QuantizedRows r = checked_rows(op, table, rows, format, dim);
    check_slot_list(op, "slots", slots, table.digests, -1);
    check_tensor(op, "keys", keys, at::kLong, 1);
    check_same_device(op, "keys", keys, table.digests);
    TORCH_CHECK_VALUE(keys.numel() == slots.numel(), "dynemb.", op, ": `keys` has ", keys.numel(),
                      " elements, `slots` has ", slots.numel());
    const InitArgs init = parse_missing(op, missing, seed);
    typename Backend::DeviceGuard guard(table.digests.device());
    at::Tensor out = at::empty({slots.numel(), dim}, slots.options().dtype(at::kFloat));
    Backend::gather_quantized(r, slots.data_ptr<int64_t>(), keys.data_ptr<int64_t>(),
                              slots.numel(), init, out.data_ptr<float>(), dim);
    return out;
  }

 private:
  /// `format` a RowFormat code, dim >= 1, rows (num_slots, quantized_row_bytes) uint8
  /// on the table's device.
  static QuantizedRows checked_rows(const char* op, const TableTensors& table,
                                    const at::Tensor& rows, int64_t format, int64_t dim) {
    TORCH_CHECK_VALUE(format >= 0 && format < kRowFormatCount, "dynemb.", op,
                      ": `format` must be 0 (INT8) or 1 (E4M3), got ", format);
    TORCH_CHECK_VALUE(dim >= 1, "dynemb.", op, ": `dim` must be >= 1, got ", dim);
    const auto f = static_cast<RowFormat>(format);
    check_tensor(op, "rows", rows, at::kByte, 2);
    check_same_device(op, "rows", rows, table.digests);
    const int64_t width = quantized_row_bytes(f, dim);
    TORCH_CHECK_VALUE(rows.size(0) == table.digests.numel() && rows.size(1) == width, "dynemb.",
                      op, ": `rows` must have shape (", table.digests.numel(), ", ", width,
                      ") (a row of ", kRowFormatNames[format], " dim=", dim,
                      " per slot), got ", rows.sizes());
    return QuantizedRows{rows.data_ptr<uint8_t>(), width, f};
  }
};

#define DYNEMB_REGISTER_QUANTIZED_OPS(m, Backend)                                 \
  do {                                                                            \
    using QImpl = ::dynemb::QuantizedOpImpls<Backend>;                            \
    DYNEMB_IMPL(m, "embedding_pool_quantized", &QImpl::pool);                     \
    DYNEMB_IMPL(m, "embedding_gather_quantized", &QImpl::gather);                 \
  } while (0)

}  // namespace dynemb
