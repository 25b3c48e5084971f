// dynemb torch layer: the training lookups that record slots (core/batch_sinks.h
// SlotSink), written once over a Backend (table_op_impls.h's pattern): one table's
// (table_find_or_insert_slots) and every table of a batch's in one call
// (table_find_or_insert_slots_grouped: the module's probe phase, see core/grouped.h).
#pragma once

#include <string>
#include <tuple>
#include <vector>

#include "torch/embedding_op_impls.h"
#include "torch/op_scope.h"

namespace dynemb {

template <class Backend>
struct SlotOpImpls {
  template <class TorchV>
  using V = typename Backend::template Value<TorchV>;

  static std::tuple<at::Tensor, at::Tensor, at::Tensor> find_or_insert_slots(
      at::TensorList table_list, at::IntArrayRef policy, at::ArrayRef<double> init,
      const at::Tensor& keys, const std::optional<at::Tensor>& scores,
      const std::optional<at::Tensor>& accesses, bool init_rows,
      const std::optional<at::Tensor>& evicted_keys, const std::optional<at::Tensor>& live) {
    constexpr const char* op = "table_find_or_insert_slots";
    UpsertCall call = check_upsert(op, table_list, policy, init, keys, scores, {});
    const TableTensors table = table_tensors(table_list);
    if (evicted_keys.has_value()) {
      check_tensor(op, "evicted_keys", *evicted_keys, at::kLong, 1);
      TORCH_CHECK_VALUE(evicted_keys->numel() == keys.numel(), "dynemb.", op,
                        ": `evicted_keys` has ", evicted_keys->numel(), " elements, `keys` has ",
                        keys.numel());
      check_same_device(op, "evicted_keys", *evicted_keys, table.digests);
    }
    check_accesses(op, accesses, keys, table, call);
    const int64_t* live_count = check_live(op, live, keys, table);
    typename Backend::DeviceGuard guard(table.digests.device());
    at::Tensor slots = at::empty_like(keys);
    at::Tensor status = at::empty(keys.sizes(), keys.options().dtype(at::kChar));
    at::Tensor counts = at::zeros({kStatusCount}, keys.options().dtype(at::kLong));
    int64_t* evicted = evicted_keys.has_value() ? evicted_keys->data_ptr<int64_t>() : nullptr;
    run(op, table, call, keys, init_rows, evicted, slots, status, counts, live_count);
    return {slots, status, counts};
  }

  /// table_find_or_insert_slots (init_rows, no evicted keys) of every
  /// table of a batch in one call: table t is tables[t * kTableTensors ..) with
  /// policies[t * kPolicySize ..), inits[t * kInitSize ..), keys[t] and accesses[t] (accesses:
  /// none or one per table). Each table's result is the per-table op's, bit for bit:
  /// the executor runs the tables of one value dtype as the parts of one upsert
  /// (core/grouped.h UpsertPart; on a GPU one launch per phase for all of them).
  /// Every argument is checked before any table changes. Returns (slots, status)
  /// per table and counts (T, 4): one read of the counts for the whole batch (on a
  /// GPU, one synchronisation instead of one per table).
  static std::tuple<std::vector<at::Tensor>, std::vector<at::Tensor>, at::Tensor>
  find_or_insert_slots_grouped(at::TensorList tables, at::IntArrayRef policies,
                               at::ArrayRef<double> inits, at::TensorList keys,
                               at::TensorList accesses, bool distinct_keys) {
    constexpr const char* op = "table_find_or_insert_slots_grouped";
    const size_t n = keys.size();
    check_list_size(op, "tables", tables.size(), n * kTableTensors, n);
    check_list_size(op, "policies", policies.size(), n * kPolicySize, n);
    check_list_size(op, "inits", inits.size(), n * kInitSize, n);
    TORCH_CHECK_VALUE(accesses.empty() || accesses.size() == n, "dynemb.", op,
                      ": `accesses` must hold no tensor or one per table (", n, "), got ",
                      accesses.size());
    TORCH_CHECK_VALUE(n >= 1, "dynemb.", op, ": needs at least one table, got none");
    for (size_t t = 0; t < n; ++t) {  // one table may appear once: its slots would go stale
      for (size_t u = 0; u < t; ++u) {
        TORCH_CHECK_VALUE(!tables[t * kTableTensors].is_same(tables[u * kTableTensors]),
                          "dynemb.", op, ": tables ", u, " and ", t, " are the same table");
      }
    }
    std::vector<std::string> names;
    std::vector<UpsertCall> calls;
    std::vector<TableTensors> table;
    names.reserve(n);
    int64_t total = 0;
    bool one_dtype = true;
    for (size_t t = 0; t < n; ++t) {
      names.push_back(table_op_name(op, t));
      const char* name = names.back().c_str();
      const at::TensorList table_list = tables.slice(t * kTableTensors, kTableTensors);
      calls.push_back(check_upsert(name, table_list, policies.slice(t * kPolicySize, kPolicySize),
                                   inits.slice(t * kInitSize, kInitSize), keys[t],
                                   std::nullopt, {}));
      calls.back().args.distinct = distinct_keys;
      check_same_device(name, "keys", keys[t], keys[0]);
      table.push_back(table_tensors(table_list));
      const std::optional<at::Tensor> a =
          accesses.empty() ? std::nullopt : std::optional<at::Tensor>(accesses[t]);
      check_accesses(name, a, keys[t], table[t], calls.back());
      one_dtype = one_dtype && table[t].values.scalar_type() == table[0].values.scalar_type();
      total += keys[t].numel();
    }
    std::vector<at::Tensor> slots, status;
    typename Backend::DeviceGuard guard(keys[0].device());
    at::Tensor counts = at::zeros({static_cast<int64_t>(n), kStatusCount}, keys[0].options());
    // One status array for the call, a range per table: the executor lists the keys its
    // second pass takes over all tables at once.
    at::Tensor flat_status = at::empty({total}, keys[0].options().dtype(at::kChar));
    for (size_t t = 0, begin = 0; t < n; begin += keys[t].numel(), ++t) {
      slots.push_back(at::empty_like(keys[t]));
      status.push_back(flat_status.narrow(0, static_cast<int64_t>(begin), keys[t].numel()));
    }
    if (!one_dtype) {  // tables of several value dtypes: one table at a time
      for (size_t t = 0; t < n; ++t) {
        at::Tensor row = counts[static_cast<int64_t>(t)];
        run(names[t].c_str(), table[t], calls[t], keys[t], true, nullptr, slots[t], status[t],
            row);
      }
      return {slots, status, counts};
    }
    dispatch_values(op, table[0].values, [&](auto v) {
      using W = V<decltype(v)>;
      std::vector<UpsertPart<W>> parts;
      for (size_t t = 0; t < n; ++t) {
        const SlotSink<W> sink{table_ref<W>(table[t]), calls[t].init, calls[t].dim,
                               slots[t].data_ptr<int64_t>(),
                               EvictedOut<W>{nullptr, nullptr, nullptr}, true};
        parts.push_back(UpsertPart<W>{sink, calls[t].args, keys[t].data_ptr<int64_t>(),
                                      status[t].data_ptr<int8_t>(),
                                      counts.data_ptr<int64_t>() + t * kStatusCount,
                                      keys[t].numel(), 0, 0, 0});
      }
      const PartTotals totals = number_parts(parts.data(), static_cast<int64_t>(n));
      Backend::upsert_grouped(parts, totals, flat_status.data_ptr<int8_t>(), keys[0].options());
    });
    return {slots, status, counts};
  }

 private:
  /// accesses (n) int64 beside `keys`: LFU adds each key's count (a de-duplicated batch).
  static void check_accesses(const char* op, const std::optional<at::Tensor>& accesses,
                             const at::Tensor& keys, const TableTensors& table,
                             UpsertCall& call) {
    if (!accesses.has_value()) return;
    check_tensor(op, "accesses", *accesses, at::kLong, 1);
    TORCH_CHECK_VALUE(accesses->numel() == keys.numel(), "dynemb.", op, ": `accesses` has ",
                      accesses->numel(), " elements, `keys` has ", keys.numel());
    check_same_device(op, "accesses", *accesses, table.digests);
    call.args.score.increments = accesses->data_ptr<int64_t>();
  }

  /// live (1) int64 on the table's device, or none: the number of keys looked up (a
  /// padded batch). Its value is checked by the CPU executor (and in safe-check mode on
  /// a GPU); a CUDA executor bounds it to [0, n] (core live_keys) without a read.
  static const int64_t* check_live(const char* op, const std::optional<at::Tensor>& live,
                                   const at::Tensor& keys, const TableTensors& table) {
    if (!live.has_value()) return nullptr;
    check_tensor(op, "live", *live, at::kLong, 1);
    TORCH_CHECK_VALUE(live->numel() == 1, "dynemb.", op, ": `live` must hold one count, got ",
                      live->numel(), " elements");
    check_same_device(op, "live", *live, table.digests);
    if (!Backend::kDeviceMemory || (!live->is_cpu() && reads_values(*live))) {
      const int64_t m = live->item<int64_t>();
      TORCH_CHECK_VALUE(m >= 0 && m <= keys.numel(), "dynemb.", op, ": `live` must be in [0, ",
                        keys.numel(), "] (the keys given), got ", m);
    }
    return live->data_ptr<int64_t>();
  }

  static void run(const char* op, const TableTensors& table, const UpsertCall& call,
                  const at::Tensor& keys, bool init_rows, int64_t* evicted, at::Tensor& slots,
                  at::Tensor& status, at::Tensor& counts, const int64_t* live = nullptr) {
    dispatch_values(op, table.values, [&](auto v) {
      using W = V<decltype(v)>;
      SlotSink<W> sink{table_ref<W>(table), call.init, call.dim, slots.data_ptr<int64_t>(),
                       EvictedOut<W>{evicted, nullptr, nullptr}, init_rows};
      Backend::upsert(sink, call.args, keys.data_ptr<int64_t>(), keys.numel(),
                      status.data_ptr<int8_t>(), counts, live);
    });
  }
};

#define DYNEMB_REGISTER_SLOT_OPS(m, Backend)                                             \
  do {                                                                                   \
    using SImpl = ::dynemb::SlotOpImpls<Backend>;                                        \
    DYNEMB_IMPL(m, "table_find_or_insert_slots", &SImpl::find_or_insert_slots);                \
    DYNEMB_IMPL(m, "table_find_or_insert_slots_grouped", &SImpl::find_or_insert_slots_grouped); \
  } while (0)

}  // namespace dynemb
