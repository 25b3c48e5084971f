// dynemb core: fused optimizer updates of one embedding row, in place.
//
// A row is [w (dim) | state]; the state lives in the row's extra columns:
//   EXACT_SGD              no state
//   EXACT_ADAGRAD          dim  accumulators   s += g^2 (per element)
//   EXACT_ROWWISE_ADAGRAD  1    accumulator    s += mean(g^2) over the row
//                                               (sum_of_squares' order)
//   ADAM                   2*dim  m (dim), v (dim)
//   FTRL                   2*dim  linear z (dim), accumulator n (dim)
// Maths follow fbgemm's TBE (tests/support/fbgemm_reference.py documents and checks
// them): w -= lr * g / (sqrt(s) + eps) for the Adagrads; Adam with bias
// correction by the module's global step and decoupled weight decay. Weight
// decay for SGD and the Adagrads is L2 (g += weight_decay * w). Arithmetic is in
// float whatever the storage type; a 16-bit row stores it rounded to nearest, or
// stochastically (core/rounding.h) with OptimizerArgs::stochastic_rounding.
//
// FTRL is FTRL-Proximal (McMahan et al. 2013, Algorithm 1) with the accumulator's
// exponent generalised as TensorFlow's learning_rate_power p (-0.5: the paper's square
// root), per element, with s(n) = n^(-p):
//   n' = n + g^2;  z += g - (s(n') - s(n)) / lr * w;  n = n'
//   w = 0 if |z| <= l1, else (sign(z) * l1 - z) / ((beta + s(n')) / lr + l2)
// The paper's (and DynamicEmb's) l2: TensorFlow's kernel adds 2 * l2 instead.
#pragma once

#include <math.h>

#include "core/macros.h"
#include "core/rounding.h"

namespace dynemb {

/// Mirrors dynemb.optimizer.EmbOptimType's kernel codes (part of the op contract).
enum class OptimizerKind : int64_t {
  kSgd = 0,
  kAdagrad = 1,
  kRowwiseAdagrad = 2,
  kAdam = 3,
  kFtrl = 4,
};
/// Number of OptimizerKind values (codes 0 .. kOptimizerKindCount - 1).
constexpr int64_t kOptimizerKindCount = static_cast<int64_t>(OptimizerKind::kFtrl) + 1;
/// Their names, by code (exported to Python: dynemb._ops.OPTIMIZER_CODES).
constexpr const char* kOptimizerNames[kOptimizerKindCount] = {"SGD", "ADAGRAD", "ROWWISE_ADAGRAD",
                                                              "ADAM", "FTRL"};

struct OptimizerArgs {
  OptimizerKind kind;
  float learning_rate;
  float eps;
  float beta1;
  float beta2;
  float weight_decay;
  float learning_rate_power;  // FTRL's p (<= 0)
  float ftrl_beta;
  float l1_reg;
  float l2_reg;
  int64_t step;  // 1-based count of updates so far, for Adam's bias correction
  bool stochastic_rounding = false;  // 16-bit rows: core/rounding.h, else to nearest
  uint64_t rounding_seed = 0;
};

/// Extra columns each optimizer keeps per row.
DYNEMB_HD DYNEMB_INLINE int64_t state_columns(OptimizerKind kind, int64_t dim) {
  switch (kind) {
    case OptimizerKind::kAdagrad: return dim;
    case OptimizerKind::kRowwiseAdagrad: return 1;
    case OptimizerKind::kAdam: return 2 * dim;
    case OptimizerKind::kFtrl: return 2 * dim;
    default: return 0;
  }
}

/// Lanes of sum_of_squares.
constexpr int64_t kSquareLanes = 8;

/// sum_of_squares' lanes added as its tree: ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7)).
/// Lanes: any eight floats lane[0..8) (an array, or a CPU vector register's lanes).
template <typename Lanes>
DYNEMB_HD DYNEMB_INLINE float add_square_lanes(const Lanes& lane) {
  const float l04 = lane[0] + lane[4], l15 = lane[1] + lane[5];
  const float l26 = lane[2] + lane[6], l37 = lane[3] + lane[7];
  return (l04 + l26) + (l15 + l37);
}

/// The sum over j < dim of (g[j] + wd * row[j])^2, in the order every executor keeps:
/// lane l (< kSquareLanes) sums the terms j = l, l + 8, l + 16, ... in ascending j,
/// then the lanes are added as a tree: ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7)).
/// One running sum in j order would make every row a chain of dim dependent float
/// additions (dim x 4 cycles, ~40% of a W-train backward on a CPU) that no compiler may
/// reorder; eight lanes are one SIMD register of independent sums.
template <typename V>
DYNEMB_HD DYNEMB_INLINE float sum_of_squares(const V* row, int64_t dim, const float* g,
                                             float wd) {
  float lane[kSquareLanes] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
  int64_t j = 0;
  for (; j + kSquareLanes <= dim; j += kSquareLanes) {
    for (int64_t l = 0; l < kSquareLanes; ++l) {
      const float gj = g[j + l] + wd * static_cast<float>(row[j + l]);
      lane[l] += gj * gj;
    }
  }
  for (int64_t l = 0; j + l < dim; ++l) {
    const float gj = g[j + l] + wd * static_cast<float>(row[j + l]);
    lane[l] += gj * gj;
  }
  return add_square_lanes(lane);
}

/// n^(-p), FTRL's per-coordinate step scale; the square root when p is -0.5 (correctly
/// rounded on every device, where powf is not).
DYNEMB_HD DYNEMB_INLINE float ftrl_scale(float n, float p) {
  return p == -0.5f ? sqrtf(n) : powf(n, -p);
}

/// Applies one update to `row` ([w | state], float-convertible V) with gradient g (dim);
/// `key` is the row's key (the stochastic rounding's bits depend on it).
template <typename V>
DYNEMB_HD void update_row(const OptimizerArgs& a, V* row, int64_t dim, const float* g,
                          int64_t key = 0) {
  V* state = row + dim;
  const RowRounding rr{a.stochastic_rounding, a.rounding_seed, key, a.step};
  const float lr = a.learning_rate, wd = a.weight_decay;
  switch (a.kind) {
    case OptimizerKind::kSgd:
      for (int64_t j = 0; j < dim; ++j) {
        const float w = static_cast<float>(row[j]);
        row[j] = rr.to<V>(w - lr * (g[j] + wd * w), j);
      }
      break;
    case OptimizerKind::kAdagrad:
      for (int64_t j = 0; j < dim; ++j) {
        const float w = static_cast<float>(row[j]);
        const float gj = g[j] + wd * w;
        const float s = static_cast<float>(state[j]) + gj * gj;
        state[j] = rr.to<V>(s, dim + j);
        row[j] = rr.to<V>(w - lr * gj / (sqrtf(s) + a.eps), j);
      }
      break;
    case OptimizerKind::kRowwiseAdagrad: {
      const float sum_sq = sum_of_squares(row, dim, g, wd);
      const float s = static_cast<float>(state[0]) + sum_sq / static_cast<float>(dim);
      state[0] = rr.to<V>(s, dim);
      const float scale = lr / (sqrtf(s) + a.eps);
      for (int64_t j = 0; j < dim; ++j) {
        const float w = static_cast<float>(row[j]);
        row[j] = rr.to<V>(w - scale * (g[j] + wd * w), j);
      }
      break;
    }
    case OptimizerKind::kAdam: {
      V* m = state;
      V* v = state + dim;
      const float t = static_cast<float>(a.step);
      const float correction1 = 1.0f - powf(a.beta1, t);
      const float correction2 = 1.0f - powf(a.beta2, t);
      for (int64_t j = 0; j < dim; ++j) {
        const float w = static_cast<float>(row[j]);
        const float mj = a.beta1 * static_cast<float>(m[j]) + (1.0f - a.beta1) * g[j];
        const float vj = a.beta2 * static_cast<float>(v[j]) + (1.0f - a.beta2) * g[j] * g[j];
        m[j] = rr.to<V>(mj, dim + j);
        v[j] = rr.to<V>(vj, 2 * dim + j);
        const float update = (mj / correction1) / (sqrtf(vj / correction2) + a.eps) + wd * w;
        row[j] = rr.to<V>(w - lr * update, j);
      }
      break;
    }
    case OptimizerKind::kFtrl: {
      V* linear = state;
      V* accum = state + dim;
      const float p = a.learning_rate_power, l1 = a.l1_reg;
      for (int64_t j = 0; j < dim; ++j) {
        const float w = static_cast<float>(row[j]);
        const float n = static_cast<float>(accum[j]);
        const float n_new = n + g[j] * g[j];
        const float s_new = ftrl_scale(n_new, p);
        const float sigma = (s_new - ftrl_scale(n, p)) / lr;
        const float z = static_cast<float>(linear[j]) + g[j] - sigma * w;
        linear[j] = rr.to<V>(z, dim + j);
        accum[j] = rr.to<V>(n_new, 2 * dim + j);
        const float quadratic = (a.ftrl_beta + s_new) / lr + a.l2_reg;
        row[j] = rr.to<V>(fabsf(z) > l1 ? (copysignf(l1, z) - z) / quadratic : 0.0f, j);
      }
      break;
    }
  }
}

}  // namespace dynemb
