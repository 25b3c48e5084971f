// dynemb torch layer: the table ops, written once over a Backend.
//
// Each op checks every argument before anything changes, builds a TableRef and
// hands it to the Backend, which runs the device's executor:
//
//   struct Backend {
//     template <class TorchV> using Value = ...;  // element type the executor uses
//     struct DeviceGuard { explicit DeviceGuard(at::Device); };  // makes it current
//     static constexpr bool kDeviceMemory;  // tensors stand for device memory (no reads)
//     static void hash_keys(keys*, n, num_buckets, bucket*, digest*);
//     static void scores_after_hit(ScoreArgs, scores*, n, out*);
//     template <class V> static void find(TableRef<V>, keys*, n, V* out, out_width, bool*);
//     template <class V> static void find_slots(TableRef<V>, keys*, n, int64_t* slots);
//     // A batch upsert by core/table_ops.h's batch rule, any Sink of core/batch_sinks.h:
//     // live: null, or the number of keys to upsert (<= n) in the keys' memory
//     // (core live_keys): a padded batch whose count the host has not read.
//     template <class Sink> static void upsert(Sink, UpsertArgs, keys*, n, int8_t* status,
//                                              at::Tensor& counts, const int64_t* live);
//     // `like`: options of the op's tensors (device), for temporaries.
//     template <class V> static void erase(TableRef<V>, keys*, n, bool*, like);
//     template <class V> static int64_t rehash(TableRef<V> src, TableRef<V> dst, int window,
//                                              like);
//   };
// ops_cpu.cpp and ops_cuda.cpp define a Backend and register these functions.
#pragma once

#include <ATen/ATen.h>

#include <optional>
#include <tuple>

#include "torch/op_args.h"
#include "torch/op_scope.h"

namespace dynemb {

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

template <class Backend>
struct TableOpImpls {
  template <class TorchV>
  using V = typename Backend::template Value<TorchV>;

  static std::tuple<at::Tensor, at::Tensor> hash_keys(const at::Tensor& keys,
                                                      int64_t num_buckets) {
    check_keys("hash_keys", keys);
    typename Backend::DeviceGuard guard(keys.device());
    TORCH_CHECK_VALUE(num_buckets >= 1 && num_buckets <= (int64_t{1} << 32),
                      "dynemb.hash_keys: `num_buckets` must be in [1, 2^32], got ", num_buckets);
    at::Tensor bucket = at::empty_like(keys);
    at::Tensor digest = at::empty(keys.sizes(), keys.options().dtype(at::kByte));
    Backend::hash_keys(keys.data_ptr<int64_t>(), keys.numel(), num_buckets,
                       bucket.data_ptr<int64_t>(), digest.data_ptr<uint8_t>());
    return {bucket, digest};
  }

  /// core/score_policy.h score_for_hit of each score (a cache tier keeps its rows'
  /// scores under the table's strategy beside the cache).
  static at::Tensor scores_after_hit(const at::Tensor& scores, int64_t strategy,
                                     int64_t batch_value, const std::optional<at::Tensor>& accesses,
                                     const std::optional<at::Tensor>& custom,
                                     int64_t half_life, int64_t decay_step) {
    constexpr const char* op = "scores_after_hit";
    check_tensor(op, "scores", scores, at::kLong, 1);
    TORCH_CHECK_VALUE(strategy >= 0 && strategy < kScoreStrategyCount, "dynemb.", op,
                      ": unknown score strategy ", strategy);
    const auto s = static_cast<ScoreStrategy>(strategy);
    if (decays(s)) {
      TORCH_CHECK_VALUE(half_life >= 1 && static_cast<uint64_t>(half_life) <= kMaxHalfLife,
                        "dynemb.", op, ": strategy ", kScoreStrategyNames[strategy],
                        " needs half_life in [1, ", kMaxHalfLife, "], got ", half_life);
      TORCH_CHECK_VALUE(decay_step >= 0 && static_cast<uint64_t>(decay_step) <= kMaxDecayStep,
                        "dynemb.", op, ": decay_step must be in [0, ", kMaxDecayStep, "], got ",
                        decay_step);
    } else {
      TORCH_CHECK_VALUE(half_life == 0 && decay_step == 0, "dynemb.", op, ": strategy ",
                        kScoreStrategyNames[strategy], " takes no half_life or decay_step, got ",
                        half_life, " and ", decay_step);
    }
    TORCH_CHECK_VALUE(s != ScoreStrategy::kCustomized || custom.has_value(), "dynemb.", op,
                      ": `custom` scores are required under the CUSTOMIZED strategy");
    const int64_t n = scores.numel();
    auto per_key = [&](const char* name, const std::optional<at::Tensor>& t) -> const int64_t* {
      if (!t.has_value()) return nullptr;
      check_tensor(op, name, *t, at::kLong, 1);
      TORCH_CHECK_VALUE(t->numel() == n, "dynemb.", op, ": `", name, "` has ", t->numel(),
                        " elements, `scores` has ", n);
      check_same_device(op, name, *t, scores);
      return t->data_ptr<int64_t>();
    };
    const ScoreArgs args{s,
                         static_cast<uint64_t>(batch_value),
                         per_key("custom", custom),
                         per_key("accesses", accesses),
                         static_cast<uint64_t>(half_life),
                         static_cast<uint64_t>(decay_step)};
    typename Backend::DeviceGuard guard(scores.device());
    at::Tensor out = at::empty_like(scores);
    Backend::scores_after_hit(args, reinterpret_cast<const uint64_t*>(scores.data_ptr<int64_t>()),
                              n, reinterpret_cast<uint64_t*>(out.data_ptr<int64_t>()));
    return out;
  }

  static at::Tensor find(at::TensorList table_list, const at::Tensor& keys, const at::Tensor& values) {
    constexpr const char* op = "table_find";
    const TableTensors table = checked_table(op, table_list);
    typename Backend::DeviceGuard guard(table.digests.device());
    check_keys(op, keys);
    check_same_device(op, "keys", keys, table.digests);
    check_rows(op, "values", values, table.values, keys.numel(), 1, table.values.size(1));
    at::Tensor found = at::empty(keys.sizes(), keys.options().dtype(at::kBool));
    dispatch_values(op, table.values, [&](auto v) {
      using W = V<decltype(v)>;
      Backend::find(table_ref<W>(table), keys.data_ptr<int64_t>(), keys.numel(),
                    reinterpret_cast<W*>(values.data_ptr()), values.size(1),
                    found.data_ptr<bool>());
    });
    return found;
  }

  static at::Tensor find_slots(at::TensorList table_list, const at::Tensor& keys) {
    constexpr const char* op = "table_find_slots";
    const TableTensors table = checked_table(op, table_list);
    typename Backend::DeviceGuard guard(table.digests.device());
    check_keys(op, keys);
    check_same_device(op, "keys", keys, table.digests);
    at::Tensor slots = at::empty_like(keys);
    dispatch_values(op, table.values, [&](auto v) {
      using W = V<decltype(v)>;
      Backend::find_slots(table_ref<W>(table), keys.data_ptr<int64_t>(), keys.numel(),
                          slots.data_ptr<int64_t>());
    });
    return slots;
  }

  static std::tuple<at::Tensor, at::Tensor> find_or_insert(
      at::TensorList table_list, at::IntArrayRef policy, at::ArrayRef<double> init,
      const at::Tensor& keys, const std::optional<at::Tensor>& scores, const at::Tensor& values,
      at::TensorList evicted) {
    constexpr const char* op = "table_find_or_insert";
    const UpsertCall call = check_upsert(op, table_list, policy, init, keys, scores, evicted);
    const TableTensors table = table_tensors(table_list);
    typename Backend::DeviceGuard guard(table.digests.device());
    check_rows(op, "values", values, table.values, keys.numel(), 1, table.values.size(1));
    auto [status, counts] = upsert_outputs(keys);
    dispatch_values(op, table.values, [&](auto v) {
      using W = V<decltype(v)>;
      FindOrInsertSink<W> sink{table_ref<W>(table), call.init, call.dim,
                               reinterpret_cast<W*>(values.data_ptr()), values.size(1),
                               evicted_out<W>(evicted)};
      Backend::upsert(sink, call.args, keys.data_ptr<int64_t>(), keys.numel(),
                              status.template data_ptr<int8_t>(), counts);
    });
    return {status, counts};
  }

  static std::tuple<at::Tensor, at::Tensor> insert_or_assign(
      at::TensorList table_list, at::IntArrayRef policy, at::ArrayRef<double> init,
      const at::Tensor& keys, const std::optional<at::Tensor>& scores, const at::Tensor& values,
      at::TensorList evicted) {
    constexpr const char* op = "table_insert_or_assign";
    const UpsertCall call = check_upsert(op, table_list, policy, init, keys, scores, evicted);
    const TableTensors table = table_tensors(table_list);
    typename Backend::DeviceGuard guard(table.digests.device());
    const int64_t row_width = table.values.size(1);
    check_rows(op, "values", values, table.values, keys.numel(), call.dim, row_width);
    TORCH_CHECK_VALUE(values.size(1) == call.dim || values.size(1) == row_width, "dynemb.", op,
                      ": `values` must have dim=", call.dim, " or row_width=", row_width,
                      " columns, got ", values.size(1));
    auto [status, counts] = upsert_outputs(keys);
    dispatch_values(op, table.values, [&](auto v) {
      using W = V<decltype(v)>;
      AssignSink<W> sink{table_ref<W>(table), call.init, call.dim,
                         reinterpret_cast<const W*>(values.data_ptr()), values.size(1),
                         evicted_out<W>(evicted)};
      Backend::upsert(sink, call.args, keys.data_ptr<int64_t>(), keys.numel(),
                      status.template data_ptr<int8_t>(), counts);
    });
    return {status, counts};
  }

  static std::tuple<at::Tensor, at::Tensor> restore(
      at::TensorList table_list, at::IntArrayRef policy, at::ArrayRef<double> init,
      const at::Tensor& keys, const at::Tensor& values, const std::optional<at::Tensor>& state,
      const std::optional<at::Tensor>& scores, const std::optional<at::Tensor>& timestamps,
      at::TensorList evicted) {
    constexpr const char* op = "table_restore";
    const bool customized = !policy.empty() && policy[0] == static_cast<int64_t>(
                                                                 ScoreStrategy::kCustomized);
    // CUSTOMIZED admits a newcomer by its score: the saved one, as a training batch would.
    const UpsertCall call =
        check_upsert(op, table_list, policy, init, keys, customized ? scores : std::nullopt, evicted);
    const TableTensors table = table_tensors(table_list);
    typename Backend::DeviceGuard guard(table.digests.device());
    const int64_t n = keys.numel(), row_width = table.values.size(1);
    check_rows(op, "values", values, table.values, n, call.dim, call.dim);
    if (state.has_value()) {
      check_rows(op, "state", *state, table.values, n, row_width - call.dim, row_width - call.dim);
    }
    auto check_meta = [&](const char* name, const std::optional<at::Tensor>& t,
                          const at::Tensor& kept) -> const int64_t* {
      if (!t.has_value()) return nullptr;
      TORCH_CHECK_VALUE(kept.numel() != 0, "dynemb.", op, ": `", name,
                        "` given but the table keeps none under strategy ", policy[0]);
      check_tensor(op, name, *t, at::kLong, 1);
      TORCH_CHECK_VALUE(t->numel() == n, "dynemb.", op, ": `", name, "` has ", t->numel(),
                        " elements, `keys` has ", n);
      check_same_device(op, name, *t, table.digests);
      return t->data_ptr<int64_t>();
    };
    const int64_t* saved_scores = check_meta("scores", scores, table.scores);
    const int64_t* saved_timestamps = check_meta("timestamps", timestamps, table.timestamps);
    auto [status, counts] = upsert_outputs(keys);
    dispatch_values(op, table.values, [&](auto v) {
      using W = V<decltype(v)>;
      const SavedEntries<W> saved{
          reinterpret_cast<const W*>(values.data_ptr()),
          state.has_value() ? reinterpret_cast<const W*>(state->data_ptr()) : nullptr,
          state.has_value() ? row_width - call.dim : 0, saved_scores, saved_timestamps};
      RestoreSink<W> sink{table_ref<W>(table), call.init, call.dim, saved,
                          evicted_out<W>(evicted)};
      Backend::upsert(sink, call.args, keys.data_ptr<int64_t>(), n,
                       status.template data_ptr<int8_t>(), counts);
    });
    return {status, counts};
  }

  static at::Tensor erase(at::TensorList table_list, const at::Tensor& keys) {
    constexpr const char* op = "table_erase";
    const TableTensors table = checked_table(op, table_list);
    typename Backend::DeviceGuard guard(table.digests.device());
    check_keys(op, keys);
    check_same_device(op, "keys", keys, table.digests);
    at::Tensor erased = at::empty(keys.sizes(), keys.options().dtype(at::kBool));
    dispatch_values(op, table.values, [&](auto v) {
      using W = V<decltype(v)>;
      Backend::erase(table_ref<W>(table), keys.data_ptr<int64_t>(), keys.numel(),
                     erased.data_ptr<bool>(), keys.options());
    });
    return erased;
  }

  static int64_t rehash(at::TensorList src_list, at::TensorList dst_list, int64_t window) {
    constexpr const char* op = "table_rehash";
    const TableTensors src = checked_table(op, src_list);
    const TableTensors dst = checked_table(op, dst_list);
    TORCH_CHECK_VALUE(src.values.scalar_type() == dst.values.scalar_type() &&
                          src.values.size(1) == dst.values.size(1) &&
                          (src.scores.numel() == 0) == (dst.scores.numel() == 0) &&
                          (src.timestamps.numel() == 0) == (dst.timestamps.numel() == 0) &&
                          (src.pins.numel() == 0) == (dst.pins.numel() == 0),
                      "dynemb.", op, ": `src` and `dst` must have the same row layout and scores");
    check_same_device(op, "dst", dst.digests, src.digests);
    typename Backend::DeviceGuard guard(src.digests.device());
    TORCH_CHECK_VALUE(window >= 1 && window <= kMaxProbeBuckets, "dynemb.", op,
                      ": `window` must be in [1, ", kMaxProbeBuckets, "], got ", window);
    return dispatch_values(op, src.values, [&](auto v) {
      using W = V<decltype(v)>;
      return Backend::rehash(table_ref<W>(src), table_ref<W>(dst), static_cast<int>(window),
                             src.keys.options());
    });
  }

 private:
  /// (status (n) int8, counts (4) int64) on the keys' device.
  static std::tuple<at::Tensor, at::Tensor> upsert_outputs(const at::Tensor& keys) {
    return {at::empty(keys.sizes(), keys.options().dtype(at::kChar)),
            at::zeros({kStatusCount}, keys.options().dtype(at::kLong))};
  }
};

/// Registers every table op of TableOpImpls<Backend> for one dispatch key.
#define DYNEMB_REGISTER_TABLE_OPS(m, Backend)                                     \
  do {                                                                            \
    using Impl = ::dynemb::TableOpImpls<Backend>;                                 \
    DYNEMB_IMPL(m, "hash_keys", &Impl::hash_keys);                                      \
    DYNEMB_IMPL(m, "scores_after_hit", &Impl::scores_after_hit);                        \
    DYNEMB_IMPL(m, "table_find", &Impl::find);                                          \
    DYNEMB_IMPL(m, "table_find_slots", &Impl::find_slots);                              \
    DYNEMB_IMPL(m, "table_find_or_insert", &Impl::find_or_insert);                      \
    DYNEMB_IMPL(m, "table_insert_or_assign", &Impl::insert_or_assign);                  \
    DYNEMB_IMPL(m, "table_restore", &Impl::restore);                                    \
    DYNEMB_IMPL(m, "table_erase", &Impl::erase);                                        \
    DYNEMB_IMPL(m, "table_rehash", &Impl::rehash);                                      \
  } while (0)

}  // namespace dynemb
