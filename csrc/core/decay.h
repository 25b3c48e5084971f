// dynemb core: time-decayed access counts in fixed point (the DECAYED_LFU strategies).
//
// A key's decayed count at step t is  n(t) = sum_j 2^-((t - s_j) / H)  over its accesses
// at steps s_j, H the half-life in steps. Storing n(t) would need a pass over the table
// every step (every count shrinks), or an epoch and periodic renormalisation. We store
// its logarithm shifted into step units instead:
//
//     L = t + H * log2 n(t)      (the same value for every t between two accesses)
//
// L is the step at which a single fresh access would weigh what all the key's accesses
// weigh now. Hence:
//   - n(t) = 2^((L - t) / H) decays with t while L stays put: no pass, no epoch.
//   - for any t, n_a(t) < n_b(t) <=> L_a < L_b: the stored scores compare the decayed
//     counts as of any moment, so tile_victim's (score, digest, key) rule stays as it
//     is and a stale score compares correctly against a fresh one.
//   - L advances at most like a STEP score (plus H * log2 of the count): it fits a
//     uint64 forever; nothing saturates in practice.
// An access of c occurrences at step s adds c * 2^0 at time s:
//     b = s + H log2 c,   L' = H log2(2^(L/H) + 2^(b/H)) = hi + H log2(1 + 2^-((hi - lo)/H))
// with hi, lo = max, min(L, b). A new key gets L = b.
//
// Fixed point, integer operations only (so every executor gives the same bits):
//   L in units of 2^-kDecayFractionBits step; the log and the power in Q30; the power
//   2^-f of a fraction f (Q16) is a product of the constants 2^-(2^-i) (Q30), the log2 of
//   a mantissa in [1, 2) is read bit by bit by squaring. Every step floors; the distance
//   (hi - lo) / H is floored to 2^-16 half-life, which can only raise the result, by at
//   most 2^-17 of a bit. So one update moves log2 of the count by less than 2^-15 from
//   the exact value (in L: less than H * 2^-15 steps), and an access adds nothing once
//   the key's decayed count exceeds about 2^30.
#pragma once

#include "core/macros.h"

namespace dynemb {

/// Fraction bits of a DECAYED_LFU score: L counts steps in units of 2^-16.
constexpr int kDecayFractionBits = 16;
/// The largest half-life (steps) and step the decayed scores take (L stays below 2^63).
constexpr uint64_t kMaxHalfLife = (uint64_t{1} << 31) - 1;
constexpr uint64_t kMaxDecayStep = uint64_t{1} << 46;

namespace decay_detail {

constexpr int kQ = 30;  // internal fixed point: Q30
constexpr uint64_t kOne = uint64_t{1} << kQ;

/// 2^-(2^-i) in Q30 (rounded to nearest), i = 1..16.
DYNEMB_HD DYNEMB_INLINE uint64_t root_of_half(int i) {
  switch (i) {
    case 1: return 759250125u;
    case 2: return 902905651u;
    case 3: return 984625594u;
    case 4: return 1028218693u;
    case 5: return 1050733751u;
    case 6: return 1062175491u;
    case 7: return 1067942999u;
    case 8: return 1070838486u;
    case 9: return 1072289173u;
    case 10: return 1073015252u;
    case 11: return 1073378477u;
    case 12: return 1073560135u;
    case 13: return 1073650976u;
    case 14: return 1073696399u;
    case 15: return 1073719111u;
    default: return 1073730468u;
  }
}

/// 2^-f for f in [0, 1) given in Q16; Q30 in (0.5, 1].
DYNEMB_HD DYNEMB_INLINE uint64_t exp2_neg_fraction(uint64_t f16) {
  uint64_t r = kOne;
  for (int i = 1; i <= 16; ++i) {
    if (f16 >> (16 - i) & 1) r = r * root_of_half(i) >> kQ;
  }
  return r;
}

/// log2(z) for z in [1, 2) given in Q30; Q30 in [0, 1). Squares z once per bit.
DYNEMB_HD DYNEMB_INLINE uint64_t log2_mantissa(uint64_t z) {
  uint64_t out = 0;
  for (int bit = kQ - 1; bit >= 0; --bit) {
    z = z * z >> kQ;
    if (z >= 2 * kOne) {
      z >>= 1;
      out |= uint64_t{1} << bit;
    }
  }
  return out;
}

/// H * log2(c) in score units (2^-16 step), c >= 1.
DYNEMB_HD DYNEMB_INLINE uint64_t scaled_log2_count(uint64_t c, uint64_t half_life) {
  int n = 0;
  while (n < 63 && (c >> (n + 1)) != 0) ++n;  // floor(log2 c)
  const uint64_t mantissa = n <= kQ ? c << (kQ - n) : c >> (n - kQ);
  const uint64_t fraction = log2_mantissa(mantissa);
  return (half_life * static_cast<uint64_t>(n) << kDecayFractionBits) +
         (half_life * fraction >> (kQ - kDecayFractionBits));
}

}  // namespace decay_detail

/// The score of one access of `count` >= 1 occurrences at `step` (a new key's score).
DYNEMB_HD DYNEMB_INLINE uint64_t decayed_access(uint64_t step, uint64_t count,
                                                uint64_t half_life) {
  return (step << kDecayFractionBits) + decay_detail::scaled_log2_count(count, half_life);
}

/// The score after adding an access scored `b` (decayed_access) to a key scored `old`.
DYNEMB_HD DYNEMB_INLINE uint64_t decayed_merge(uint64_t old, uint64_t b, uint64_t half_life) {
  using namespace decay_detail;
  const uint64_t hi = old > b ? old : b;
  const uint64_t lo = old > b ? b : old;
  const uint64_t x = (hi - lo) / half_life;  // half-lives apart, Q16
  if (x >> 16 >= kQ) return hi;              // 2^-x below the Q30 resolution
  const uint64_t y = exp2_neg_fraction(x & 0xFFFF) >> (x >> 16);
  const uint64_t g = y == kOne ? kOne : log2_mantissa(kOne + y);  // log2(1 + 2^-x), Q30
  const uint64_t add = half_life * g >> (kQ - kDecayFractionBits);
  constexpr uint64_t kCap = 0x7FFFFFFFFFFFFFFFull;  // scores leave the table as int64
  return hi >= kCap || add >= kCap - hi ? kCap : hi + add;
}

}  // namespace dynemb
