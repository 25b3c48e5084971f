// dynemb torch layer: the positional lists that cross the op boundary, named once.
//
// TorchScript schemas have no structs, so an op takes a table's buffers, an upsert's
// policy, an initializer and the optimizer as flat lists. The order of each scalar
// list's fields is defined here and only here (a table's tensors: tensor_checks.h
// kTableTensorNames): the parsers (op_args.h, embedding_op_impls.h) index the lists
// through these enums and name them in their errors with these names, and
// dynemb._C.constants["op_lists"] exports the names, which dynemb/_ops.py's named
// tuples follow and TableStorage.tensors() is built from (tests/csrc/test_op_lists.py
// fails when one drifts). A grouped op takes table t's list at [t * size, t * size +
// size) of its list of lists.
#pragma once

#include <cstddef>
#include <string>

namespace dynemb::op_list {

/// `policy` of upserts (int[]): PolicyArgs (op_args.h).
enum Policy : size_t {
  kStrategy,    // ScoreStrategy code
  kBatchValue,  // the batch's timestamp or step (core/score_policy.h)
  kSeed,        // the initializer's seed
  kEvictBelow,  // -1: any resident may be evicted, 0: none (core/table_ops.h)
  kDim,         // columns the op initialises / writes
  kPin,         // the batch's pin number (core/table_ops.h "Pins")
  kPinFloor,    // residents pinned at or above it stay
  kHalfLife,    // DECAYED_LFU strategies: steps (core/decay.h); may be left out
  kDecayStep,   // DECAYED_LFU strategies: the batch's step; may be left out
  kPolicySize
};
inline constexpr const char* kPolicyFieldNames[kPolicySize] = {
    "strategy", "batch_value", "seed", "evict_below", "dim", "pin", "pin_floor", "half_life",
    "decay_step"};
/// A single table's policy may stop before the decay fields.
inline constexpr size_t kPolicySizeNoDecay = kHalfLife;

/// `init` / `missing` of ops that write new rows (float[]): InitArgs (core/initializer.h).
enum Init : size_t {
  kMode,          // InitMode code
  kA,             // UNIFORM: lower bound; NORMAL: mean; CONSTANT: the value
  kB,             // UNIFORM: upper bound; NORMAL: std_dev
  kLower,         // the truncation bounds
  kUpper,         //
  kExtraValue,    // the value of the extra (optimizer-state) columns of a new row
  kColumnOffset,  // the first column of a wider row the table holds (a whole number)
  kExtraZeros,    // the first extra columns that start at 0, not extra_value (a whole number)
  kInitSize
};
inline constexpr const char* kInitFieldNames[kInitSize] = {
    "mode", "a", "b", "lower", "upper", "extra_value", "column_offset", "extra_zeros"};
/// A single op's init may stop before extra_zeros (0); a grouped op's lists may not.
inline constexpr size_t kInitSizeNoZeros = kExtraZeros;

/// `optimizer` of backward ops (float[]): OptimizerArgs (core/optimizer_rules.h).
enum Optimizer : size_t {
  kKind,  // OptimizerKind code
  kLearningRate,
  kEps,
  kBeta1,
  kBeta2,
  kWeightDecay,
  kLearningRatePower,  // FTRL
  kFtrlBeta,           // FTRL
  kL1Reg,              // FTRL
  kL2Reg,              // FTRL
  kStochasticRounding,  // 1: 16-bit rows round stochastically (core/rounding.h), 0: to nearest
  kRoundingSeed,        // the rounding bits' seed (a whole number below 2^53)
  kOptimizerSize
};
inline constexpr const char* kOptimizerFieldNames[kOptimizerSize] = {
    "kind",         "learning_rate",       "eps",       "beta1",  "beta2",
    "weight_decay", "learning_rate_power", "ftrl_beta", "l1_reg", "l2_reg",
    "stochastic_rounding", "rounding_seed"};
/// The list may stop before FTRL's fields (the other optimizers do not read them), or
/// before the rounding's (rounded to nearest).
inline constexpr size_t kOptimizerSizeNoFtrl = kLearningRatePower;
inline constexpr size_t kOptimizerSizeNoRounding = kStochasticRounding;

/// "[a, b, c]": a list's field names, for the parsers' errors.
template <size_t N>
std::string names_of(const char* const (&names)[N]) {
  std::string out = "[";
  for (size_t i = 0; i < N; ++i) out += (i ? ", " : "") + std::string(names[i]);
  return out + "]";
}

}  // namespace dynemb::op_list
