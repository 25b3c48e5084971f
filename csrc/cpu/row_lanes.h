// dynemb CPU executor: float row loops at a dim known when compiling, summed in
// registers.
//
// pooling.h's loops take dim at run time: each index of a bag then loads, adds to and
// stores the whole output row (the compiler cannot keep it in registers), behind a
// run-time alias check. For float tables whose dim is a multiple of 8 up to kMaxLaneDim
// (most embedding dims), the executor instead keeps the row being summed in dim / 8
// registers of 8 floats. Each element still gets the same terms, in the same order and
// rounded the same way (a fused multiply-add where pooling.h has fmaf; no other
// contraction: -ffp-contract=off), so the bits are pooling.h's.
#pragma once

#include <math.h>
#ifdef __FMA__
#include <immintrin.h>
#endif

#include <cstdint>
#include <utility>

#include "core/macros.h"
#include "core/optimizer_rules.h"

namespace dynemb::cpu {

// Loops over a row's registers are unrolled whole (GCC keeps an array member in
// registers only when every index is a constant).
#define DYNEMB_UNROLL_LANES _Pragma("GCC unroll 16")

/// 8 floats in a register.
typedef float Lane8 __attribute__((vector_size(32)));
/// The same at any float's address (rows start at any float): reading or writing one
/// through a pointer is an unaligned vector load or store, allowed to alias the floats
/// (may_alias, as the compilers' own _mm256_loadu_ps does). (memcpy into a Lane8 went
/// through the stack in two halves, and each add then waited on that store.)
typedef float UnalignedLane8 __attribute__((vector_size(32), aligned(4), may_alias));

/// The largest dim with a register kernel (16 registers of 8 floats).
constexpr int64_t kMaxLaneDim = 128;

/// fmaf(w, x[l], acc[l]) for each lane l: one vfmadd where the target has FMA (the
/// build's -march=native), otherwise libm's fmaf per lane (same bits, slower).
DYNEMB_INLINE Lane8 fma8(float w, Lane8 x, Lane8 acc) {
#ifdef __FMA__
  return reinterpret_cast<Lane8>(_mm256_fmadd_ps(_mm256_set1_ps(w), reinterpret_cast<__m256>(x),
                                                 reinterpret_cast<__m256>(acc)));
#else
  for (int l = 0; l < 8; ++l) acc[l] = fmaf(w, x[l], acc[l]);
  return acc;
#endif
}

/// A row of kDim floats held in registers.
template <int64_t kDim>
struct LaneRow {
  static_assert(kDim % 8 == 0 && kDim > 0 && kDim <= kMaxLaneDim);
  static constexpr int64_t kLanes = kDim / 8;
  Lane8 lane[kLanes];

  DYNEMB_INLINE static LaneRow zeros() {
    LaneRow r;
    DYNEMB_UNROLL_LANES
    for (int64_t c = 0; c < kLanes; ++c) r.lane[c] = Lane8{};
    return r;
  }
  DYNEMB_INLINE static Lane8 load(const float* p, int64_t c) {
    return *reinterpret_cast<const UnalignedLane8*>(p + 8 * c);
  }
  /// this += x (row x of kDim floats).
  DYNEMB_INLINE void add(const float* x) {
    DYNEMB_UNROLL_LANES
    for (int64_t c = 0; c < kLanes; ++c) lane[c] += load(x, c);
  }
  /// this += x (another row in registers).
  DYNEMB_INLINE void add(const LaneRow& x) {
    DYNEMB_UNROLL_LANES
    for (int64_t c = 0; c < kLanes; ++c) lane[c] += x.lane[c];
  }
  /// this = fma(w, x, this): each element w * x[j] + this[j] rounded once (pooling.h's
  /// forward rounding).
  DYNEMB_INLINE void add_fused(float w, const float* x) {
    DYNEMB_UNROLL_LANES
    for (int64_t c = 0; c < kLanes; ++c) lane[c] = fma8(w, load(x, c), lane[c]);
  }
  /// this += w * x: each element w * x[j] rounded, then added (pooling.h's gradient
  /// order, add_gradient).
  DYNEMB_INLINE void add_scaled(float w, const float* x) {
    DYNEMB_UNROLL_LANES
    for (int64_t c = 0; c < kLanes; ++c) lane[c] += w * load(x, c);
  }
  DYNEMB_INLINE void scale(float s) {
    DYNEMB_UNROLL_LANES
    for (int64_t c = 0; c < kLanes; ++c) lane[c] *= s;
  }
  DYNEMB_INLINE void store(float* out) const {
    DYNEMB_UNROLL_LANES
    for (int64_t c = 0; c < kLanes; ++c) *reinterpret_cast<UnalignedLane8*>(out + 8 * c) = lane[c];
  }
};

/// core update_row's EXACT_ROWWISE_ADAGRAD on a float row ([w | state], kDim + 1
/// floats) whose gradient g is in registers: the same operations on each element,
/// and sum_of_squares' order: element j goes to lane j % 8 in ascending j (register
/// c holds elements 8c .. 8c + 7, so lane l is register lane l), the lanes added as
/// its tree (core add_square_lanes). So the same bits, in vector registers (compiled
/// from update_row, the lane sums and the row update stayed scalar: ~190 instructions
/// a row of 16).
template <int64_t kDim>
DYNEMB_INLINE void rowwise_adagrad_update(const OptimizerArgs& a, float* row,
                                          const LaneRow<kDim>& g) {
  using Row = LaneRow<kDim>;
  const float wd = a.weight_decay;
  Lane8 squares{};
  DYNEMB_UNROLL_LANES
  for (int64_t c = 0; c < Row::kLanes; ++c) {
    const Lane8 gj = g.lane[c] + wd * Row::load(row, c);
    squares += gj * gj;
  }
  const float sum_sq = add_square_lanes(squares);
  float* const state = row + kDim;
  const float s = state[0] + sum_sq / static_cast<float>(kDim);
  state[0] = s;
  const float scale = a.learning_rate / (sqrtf(s) + a.eps);
  DYNEMB_UNROLL_LANES
  for (int64_t c = 0; c < Row::kLanes; ++c) {
    const Lane8 w = Row::load(row, c);
    *reinterpret_cast<UnalignedLane8*>(row + 8 * c) = w - scale * (g.lane[c] + wd * w);
  }
}

/// Calls f(std::integral_constant<int64_t, dim>{}) when dim has a register kernel
/// (8, 16, 32, 64, 128) and returns true; false otherwise (f not called).
template <class F>
DYNEMB_INLINE bool with_lane_dim(int64_t dim, F&& f) {
  switch (dim) {
    case 8: f(std::integral_constant<int64_t, 8>{}); return true;
    case 16: f(std::integral_constant<int64_t, 16>{}); return true;
    case 32: f(std::integral_constant<int64_t, 32>{}); return true;
    case 64: f(std::integral_constant<int64_t, 64>{}); return true;
    case 128: f(std::integral_constant<int64_t, 128>{}); return true;
    default: return false;
  }
}

}  // namespace dynemb::cpu
