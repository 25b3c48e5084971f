// dynemb torch layer: parsing and checking the scalar lists of upsert ops
// (policy, init) and their row tensors; shared by every backend.
#pragma once

#include <ATen/ATen.h>

#include <optional>

#include "core/batch_sinks.h"
#include "core/table_ops.h"
#include "torch/op_lists.h"
#include "torch/tensor_checks.h"

namespace dynemb {

/// The decoded scalar arguments of one upsert call.
struct UpsertCall {
  UpsertArgs args;
  InitArgs init;
  int64_t dim;
};

/// rows: (n, width) with min_width <= width <= max_width, the table's value dtype.
inline void check_rows(const char* op, const char* name, const at::Tensor& rows,
                       const at::Tensor& table_values, int64_t n, int64_t min_width,
                       int64_t max_width) {
  TORCH_CHECK_TYPE(rows.scalar_type() == table_values.scalar_type(), "dynemb.", op, ": `", name,
                   "` must have the table's dtype ", table_values.scalar_type(), ", got ",
                   rows.scalar_type());
  TORCH_CHECK_VALUE(rows.dim() == 2 && rows.size(0) == n && rows.size(1) >= min_width &&
                        rows.size(1) <= max_width && rows.is_contiguous(),
                    "dynemb.", op, ": `", name, "` must be a contiguous (", n, ", w) tensor with ",
                    min_width, " <= w <= ", max_width, ", got shape ", rows.sizes());
  check_same_device(op, name, rows, table_values);
}

/// The op argument `policy` by name (op_lists.h op_list::Policy); the decay fields
/// (DECAYED_LFU strategies only) may be left out of a single table's policy.
struct PolicyArgs {
  ScoreStrategy strategy;
  int64_t batch_value;  // the batch's timestamp or step (score_policy.h)
  int64_t seed;         // the initializer's seed
  int64_t evict_below;  // -1: any resident may be evicted, 0: none (table_ops.h)
  int64_t dim;          // columns the op initialises / writes
  int64_t pin;          // the batch's pin number, in [0, kNoPins) (table_ops.h "Pins")
  int64_t pin_floor;    // residents pinned at or above it stay; kNoPins: none pinned
  int64_t half_life;    // DECAYED_LFU strategies: steps (core/decay.h), else 0
  int64_t decay_step;   // DECAYED_LFU strategies: the batch's step, else 0
};
constexpr size_t kPolicySize = op_list::kPolicySize;
constexpr size_t kPolicySizeNoDecay = op_list::kPolicySizeNoDecay;
constexpr size_t kInitSize = op_list::kInitSize;

inline PolicyArgs parse_policy(const char* op, at::IntArrayRef policy) {
  namespace L = op_list;
  TORCH_CHECK_VALUE(policy.size() == kPolicySize || policy.size() == kPolicySizeNoDecay,
                    "dynemb.", op, ": `policy` must be ", L::names_of(L::kPolicyFieldNames),
                    ", got ", policy.size(), " values");
  const int64_t strategy = policy[L::kStrategy];
  TORCH_CHECK_VALUE(strategy >= 0 && strategy < kScoreStrategyCount,
                    "dynemb.", op, ": unknown score strategy ", strategy);
  const int64_t no_pins = static_cast<int64_t>(kNoPins);
  const int64_t pin = policy[L::kPin], pin_floor = policy[L::kPinFloor];
  TORCH_CHECK_VALUE(pin >= 0 && pin < no_pins && pin_floor >= 0 && pin_floor <= no_pins,
                    "dynemb.", op, ": `policy` pin must be in [0, ", no_pins,
                    ") and pin_floor in [0, ", no_pins, "], got ", pin, " and ", pin_floor);
  const bool full = policy.size() == kPolicySize;
  const int64_t half_life = full ? policy[L::kHalfLife] : 0;
  const int64_t decay_step = full ? policy[L::kDecayStep] : 0;
  const auto s = static_cast<ScoreStrategy>(strategy);
  if (decays(s)) {
    TORCH_CHECK_VALUE(half_life >= 1 && static_cast<uint64_t>(half_life) <= kMaxHalfLife,
                      "dynemb.", op, ": `policy` half_life must be in [1, ", kMaxHalfLife,
                      "] steps under strategy ", kScoreStrategyNames[strategy], ", got ",
                      half_life);
    TORCH_CHECK_VALUE(decay_step >= 0 && static_cast<uint64_t>(decay_step) <= kMaxDecayStep,
                      "dynemb.", op, ": `policy` decay_step must be in [0, ", kMaxDecayStep,
                      "], got ", decay_step);
  }
  return PolicyArgs{s,
                    policy[L::kBatchValue],
                    policy[L::kSeed],
                    policy[L::kEvictBelow],
                    policy[L::kDim],
                    pin,
                    pin_floor,
                    half_life,
                    decay_step};
}

/// The op argument `init` (op_lists.h op_list::Init) with `seed`.
inline InitArgs parse_init(const char* op, const char* name, at::ArrayRef<double> init,
                           int64_t seed) {
  namespace L = op_list;
  TORCH_CHECK_VALUE(init.size() == kInitSize || init.size() == L::kInitSizeNoZeros, "dynemb.",
                    op, ": `", name, "` must be ", L::names_of(L::kInitFieldNames), ", got ",
                    init.size(), " values");
  const auto mode = static_cast<int64_t>(init[L::kMode]);
  TORCH_CHECK_VALUE(mode >= 0 && mode < kInitModeCount, "dynemb.", op,
                    ": unknown initializer mode ", mode);
  // Column counters are 32 bits (draw32): an offset is a whole number below 2^31.
  const double offset = init[L::kColumnOffset];
  TORCH_CHECK_VALUE(offset >= 0 && offset < 2147483648.0 &&
                        offset == static_cast<double>(static_cast<int64_t>(offset)),
                    "dynemb.", op, ": `", name, "`'s column_offset must be a whole number in [0, ",
                    "2^31), got ", offset);
  const double zeros = init.size() > L::kExtraZeros ? init[L::kExtraZeros] : 0.0;
  TORCH_CHECK_VALUE(zeros >= 0 && zeros < 2147483648.0 &&
                        zeros == static_cast<double>(static_cast<int64_t>(zeros)),
                    "dynemb.", op, ": `", name, "`'s extra_zeros must be a whole number in [0, ",
                    "2^31), got ", zeros);
  return InitArgs{static_cast<InitMode>(mode),
                  static_cast<float>(init[L::kA]),
                  static_cast<float>(init[L::kB]),
                  static_cast<float>(init[L::kLower]),
                  static_cast<float>(init[L::kUpper]),
                  static_cast<float>(init[L::kExtraValue]),
                  static_cast<uint64_t>(seed),
                  static_cast<int64_t>(offset),
                  static_cast<int64_t>(zeros)};
}

inline UpsertCall check_upsert(const char* op, at::TensorList table_list,
                               at::IntArrayRef policy_list, at::ArrayRef<double> init,
                               const at::Tensor& keys, const std::optional<at::Tensor>& scores,
                               at::TensorList evicted) {
  const TableTensors table = checked_table(op, table_list);
  check_keys(op, keys);
  check_same_device(op, "keys", keys, table.digests);
  const PolicyArgs policy = parse_policy(op, policy_list);
  const ScoreStrategy s = policy.strategy;
  if (s == ScoreStrategy::kCache) {  // the batch number shares the score with a count
    auto fits = [](int64_t v) { return v >= 0 && static_cast<uint64_t>(v) <= kCacheBatchMask; };
    TORCH_CHECK_VALUE(fits(policy.batch_value) &&
                          (policy.evict_below == -1 || fits(policy.evict_below)),
                      "dynemb.", op,
                      ": a cache tier's batch number and floor must be in [0, 2^32), got ",
                      policy.batch_value, " and ", policy.evict_below);
  }
  TORCH_CHECK_VALUE(keeps_scores(s) == (table.scores.numel() != 0) &&
                        keeps_timestamps(s) == (table.timestamps.numel() != 0) &&
                        keeps_scores(s) == (table.pins.numel() != 0),
                    "dynemb.", op, ": the table's score buffers do not match strategy ",
                    static_cast<int64_t>(s));
  const int64_t row_width = table.row_width();
  TORCH_CHECK_VALUE(policy.dim >= 0 && policy.dim <= row_width, "dynemb.", op, ": dim ",
                    policy.dim, " must be in [0, row_width=", row_width, "]");
  const InitArgs init_args = parse_init(op, "init", init, policy.seed);
  const int64_t* custom = nullptr;
  if (s == ScoreStrategy::kCustomized) {
    TORCH_CHECK_VALUE(scores.has_value(), "dynemb.", op,
                      ": `scores` are required under the CUSTOMIZED strategy");
  }
  if (scores.has_value()) {
    TORCH_CHECK_VALUE(s == ScoreStrategy::kCustomized, "dynemb.", op,
                      ": `scores` are accepted only under the CUSTOMIZED strategy");
    check_tensor(op, "scores", *scores, at::kLong, 1);
    TORCH_CHECK_VALUE(scores->numel() == keys.numel(), "dynemb.", op, ": `scores` has ",
                      scores->numel(), " elements, `keys` has ", keys.numel());
    check_same_device(op, "scores", *scores, table.digests);
    custom = scores->data_ptr<int64_t>();
  }
  if (!evicted.empty()) {
    TORCH_CHECK_VALUE(evicted.size() == 3, "dynemb.", op,
                      ": `evicted` must be [] or [keys, rows, scores]");
    check_tensor(op, "evicted.keys", evicted[0], at::kLong, 1);
    check_tensor(op, "evicted.scores", evicted[2], at::kLong, 1);
    TORCH_CHECK_VALUE(evicted[0].numel() == keys.numel() && evicted[2].numel() == keys.numel(),
                      "dynemb.", op, ": evicted.keys and evicted.scores need ", keys.numel(),
                      " elements");
    check_rows(op, "evicted.rows", evicted[1], table.values, keys.numel(), row_width, row_width);
  }
  UpsertCall call;
  call.args.score = ScoreArgs{s,
                              static_cast<uint64_t>(policy.batch_value),
                              custom,
                              nullptr,
                              static_cast<uint64_t>(policy.half_life),
                              static_cast<uint64_t>(policy.decay_step)};
  // evict_below travels as an int64: -1 is kEvictAny, 0 never evicts.
  call.args.evict_below = static_cast<uint64_t>(policy.evict_below);
  call.args.pin = static_cast<uint32_t>(policy.pin);
  call.args.pin_floor = static_cast<uint32_t>(policy.pin_floor);
  call.dim = policy.dim;
  call.init = init_args;
  return call;
}

template <class V>
EvictedOut<V> evicted_out(at::TensorList evicted) {
  if (evicted.empty()) return EvictedOut<V>{nullptr, nullptr, nullptr};
  return EvictedOut<V>{evicted[0].data_ptr<int64_t>(), reinterpret_cast<V*>(evicted[1].data_ptr()),
                       evicted[2].data_ptr<int64_t>()};
}

}  // namespace dynemb
