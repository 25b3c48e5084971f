// dynemb core: stochastic rounding of float results to 16-bit rows.
//
// A float stored in a float16 / bfloat16 row is rounded to nearest by default, so an
// update smaller than half the spacing of the row's value vanishes. Stochastic
// rounding (fbgemm's stochastic_rounding) adds random bits below the kept mantissa
// and truncates: it rounds up with probability (x - lo) / (hi - lo), so the stored
// value is x in expectation. The bits are a counter-based hash of (seed, key, column,
// step): the same on every executor, in a replay and after a restart.
#pragma once

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "core/hash.h"
#include "core/macros.h"

namespace dynemb {

/// 32 random bits of element `column` of `key`'s row at optimizer step `step`.
DYNEMB_HD DYNEMB_INLINE uint32_t rounding_bits(uint64_t seed, int64_t key, int64_t column,
                                               int64_t step) {
  const uint64_t stream = mix64(static_cast<uint64_t>(key) ^ mix64(seed ^ 0xA0761D6478BD642FULL));
  const uint64_t counter = static_cast<uint64_t>(step) * 0x9E3779B97F4A7C15ULL +
                           static_cast<uint64_t>(column) * 0xBF58476D1CE4E5B9ULL;
  return static_cast<uint32_t>(mix64(stream ^ counter) >> 32);
}

DYNEMB_HD DYNEMB_INLINE uint32_t float_bits(float x) {
  uint32_t b;
  memcpy(&b, &x, sizeof b);
  return b;
}

DYNEMB_HD DYNEMB_INLINE float bits_float(uint32_t b) {
  float x;
  memcpy(&x, &b, sizeof x);
  return x;
}

/// x in V's grid: one of its two neighbours there, the upper (in magnitude) with
/// probability (|x| - |lo|) / (|hi| - |lo|) over the 16 (bfloat16) or 13 (float16)
/// low bits of `r`. V is a 16-bit float type; float16's subnormals (|x| < 2^-14) are
/// rounded on their fixed spacing 2^-24 with 16 bits of `r`.
template <typename V>
DYNEMB_HD DYNEMB_INLINE V round_stochastic(float x, uint32_t r) {
  if (!isfinite(x)) return static_cast<V>(x);
  // float16 keeps 10 mantissa bits (1 + 2^-10 is one of its values), bfloat16 7.
  const float probe = 1.0f + 0.0009765625f;
  const bool half = static_cast<float>(static_cast<V>(probe)) == probe;
  if (!half) {
    const uint32_t b = (float_bits(x) + (r & 0xFFFFu)) & 0xFFFF0000u;
    return static_cast<V>(bits_float(b));
  }
  const float magnitude = fabsf(x);
  if (magnitude >= 0.00006103515625f) {  // 2^-14: float16's normal range
    const uint32_t b = (float_bits(x) + (r & 0x1FFFu)) & ~0x1FFFu;
    return static_cast<V>(bits_float(b));
  }
  const float q = magnitude * 16777216.0f;  // in units of 2^-24, exactly
  const float low = floorf(q);
  const float up = (q - low) * 65536.0f > static_cast<float>(r & 0xFFFFu) ? 1.0f : 0.0f;
  return static_cast<V>(copysignf((low + up) * 5.9604644775390625e-8f, x));  // * 2^-24
}

/// Rounding of an optimizer's stores into a row: to nearest, or stochastic.
struct RowRounding {
  bool stochastic;
  uint64_t seed;
  int64_t key;
  int64_t step;

  template <typename V>
  DYNEMB_HD DYNEMB_INLINE V to(float x, int64_t column) const {
    if constexpr (sizeof(V) == 2) {
      if (stochastic) return round_stochastic<V>(x, rounding_bits(seed, key, column, step));
    }
    return static_cast<V>(x);
  }
};

}  // namespace dynemb
