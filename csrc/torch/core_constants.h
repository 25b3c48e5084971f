// dynemb torch layer: the op contract's codes, rules and positional lists (op_lists.h),
// exported to Python as dynemb._C.constants (a dict) and dynemb._C.state_columns /
// spill_window, so that dynemb/_ops.py reads them from csrc/core instead of restating
// them. The test
// oracle (tests/support/reference.py) keeps its own copy on purpose, and
// tests/csrc/test_core_constants.py checks the Python enums against these.
#pragma once

#include <torch/extension.h>

#include "core/initializer.h"
#include "core/macros.h"
#include "core/optimizer_rules.h"
#include "core/pooling.h"
#include "core/quantized_rows.h"
#include "core/score_policy.h"
#include "core/table_ops.h"
#include "core/table_ref.h"
#include "torch/op_lists.h"
#include "torch/tensor_checks.h"

namespace dynemb {

/// {name: code} of an enum whose names core lists by code.
template <size_t N>
pybind11::dict codes(const char* const (&names)[N]) {
  pybind11::dict d;
  for (size_t code = 0; code < N; ++code) d[names[code]] = static_cast<int64_t>(code);
  return d;
}

/// [name, ...] of a list's fields, in order; `prefix` (e.g. "table.") left out.
template <size_t N>
pybind11::list field_names(const char* const (&names)[N], const std::string& prefix = "") {
  pybind11::list out;
  for (const char* name : names) {
    const std::string n(name);
    out.append(n.rfind(prefix, 0) == 0 ? n.substr(prefix.size()) : n);
  }
  return out;
}

inline pybind11::dict core_constants() {
  pybind11::dict out;
  out["score_strategies"] = codes(kScoreStrategyNames);
  out["statuses"] = codes(kStatusNames);
  out["status_count"] = kStatusCount;
  out["init_modes"] = codes(kInitModeNames);
  out["pooling_modes"] = codes(kPoolingModeNames);
  out["row_formats"] = codes(kRowFormatNames);
  out["optimizers"] = codes(kOptimizerNames);
  pybind11::dict sources;  // strategy code -> what its batch_value is
  for (int64_t code = 0; code < kScoreStrategyCount; ++code) {
    const auto source = batch_value_source(static_cast<ScoreStrategy>(code));
    sources[pybind11::int_(code)] = kBatchValueSourceNames[static_cast<int64_t>(source)];
  }
  out["batch_value_sources"] = sources;
  out["max_probe_buckets"] = kMaxProbeBuckets;
  out["holed_flag"] = TableRef<float>::kHoled;
  out["second_bucket_span"] = kSecondBucketSpan;
  out["evict_any"] = static_cast<int64_t>(kEvictAny);  // -1 as the ops' int64
  out["max_score"] = static_cast<int64_t>(kMaxScore);
  out["no_pins"] = static_cast<int64_t>(kNoPins);
  out["cache_batch_mask"] = static_cast<int64_t>(kCacheBatchMask);  // a cache score's batch
  out["decay_fraction_bits"] = kDecayFractionBits;  // core/decay.h
  out["max_half_life"] = static_cast<int64_t>(kMaxHalfLife);
  out["max_decay_step"] = static_cast<int64_t>(kMaxDecayStep);
  pybind11::dict lists;  // the ops' positional lists, field names in order (op_lists.h)
  lists["table"] = field_names(kTableTensorNames, "table.");
  lists["policy"] = field_names(op_list::kPolicyFieldNames);
  lists["init"] = field_names(op_list::kInitFieldNames);
  lists["optimizer"] = field_names(op_list::kOptimizerFieldNames);
  out["op_lists"] = lists;
  out["policy_size_no_decay"] = static_cast<int64_t>(op_list::kPolicySizeNoDecay);
  out["init_size_no_zeros"] = static_cast<int64_t>(op_list::kInitSizeNoZeros);
  out["optimizer_size_no_ftrl"] = static_cast<int64_t>(op_list::kOptimizerSizeNoFtrl);
  out["optimizer_size_no_rounding"] = static_cast<int64_t>(op_list::kOptimizerSizeNoRounding);
  return out;
}

inline void export_core_constants(pybind11::module& m) {
  m.attr("constants") = core_constants();
  m.def(
      "state_columns",
      [](int64_t optimizer, int64_t dim) {
        return state_columns(static_cast<OptimizerKind>(optimizer), dim);
      },
      "Optimizer-state columns per row (core/optimizer_rules.h).");
  m.def(
      "spill_window",
      [](int64_t strategy, int64_t num_buckets) {
        TableRef<float> t{};
        t.num_buckets = num_buckets;
        return window_of(t, static_cast<ScoreStrategy>(strategy));
      },
      "Buckets a key may occupy from its home bucket (core/table_ops.h window_of).");
}

}  // namespace dynemb
