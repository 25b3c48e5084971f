// dynemb core: the rows given to new keys.
//
// A new row depends only on (seed, key, column): element j draws from a
// counter-based generator keyed by stream_of(seed, key), so the same key gets the
// same initial row whatever the batch order, thread count, device or world size.
// A column slice of a wider table (column-wise sharding) starts at `column_offset`:
// its element j is column column_offset + j of the whole table's row, so the slices
// side by side are the row the unsharded table would give.
// Extra columns (optimizer state) start at `extra_value`, but for the first
// `extra_zeros` of them, which start at 0 (FTRL: its linear term, before the
// accumulator that starts at the initial accumulator value).
//
// UNIFORM, the default mode, draws one 32-bit word per element (draw32): 32-bit
// multiplies, so a row's draws run in vector lanes (AVX2 has no 64-bit multiply;
// the 64-bit draws cost a new row of 64 ~490 instructions, a third of a training
// lookup when half its keys are new). The normal modes keep the 64-bit draws: their
// logarithms and sines cost more than the draws.
#pragma once

#include <math.h>

#include "core/hash.h"

namespace dynemb {

/// The op codes of dynemb.DynamicEmbInitializerMode (part of the op contract; the
/// Python enum's values are DynamicEmb's strings, mapped to these codes).
enum class InitMode : int64_t {
  kNormal = 0,
  kTruncatedNormal = 1,
  kUniform = 2,
  kConstant = 3,
  kDebug = 4,  // DynamicEmb's DEBUG: float(key mod 100000), the key read as uint64
};
/// Number of InitMode values (codes 0 .. kInitModeCount - 1).
constexpr int64_t kInitModeCount = static_cast<int64_t>(InitMode::kDebug) + 1;
/// Their names, by code (DynamicEmbInitializerMode member names).
constexpr const char* kInitModeNames[kInitModeCount] = {"NORMAL", "TRUNCATED_NORMAL", "UNIFORM",
                                                        "CONSTANT", "DEBUG"};

/// DynamicEmb's DEBUG rows repeat every kDebugModulus keys.
constexpr uint64_t kDebugModulus = 100000;

struct InitArgs {
  InitMode mode;
  float a;  // uniform: lower;  normal: mean;    constant: value
  float b;  // uniform: upper;  normal: std_dev
  float lower;  // truncated normal bounds
  float upper;
  float extra_value;  // value of the extra (optimizer state) columns
  uint64_t seed;
  int64_t column_offset = 0;  // the first column of a column slice (0: a whole row)
  int64_t extra_zeros = 0;    // the first extra columns start at 0, not extra_value
};

/// Extra (optimizer-state) column e (0: the first past the embedding) of a new row.
DYNEMB_HD DYNEMB_INLINE float extra_element(const InitArgs& a, int64_t e) {
  return e < a.extra_zeros ? 0.0f : a.extra_value;
}

/// A uniform in [0, 1) (24-bit resolution) from the top bits of a 32-bit draw.
DYNEMB_HD DYNEMB_INLINE float unit_of(uint32_t r) {
  return static_cast<float>(r >> 8) * (1.0f / 16777216.0f);  // 2^-24
}

/// Two independent uniforms in [0, 1) (24-bit resolution) from one 64-bit draw.
DYNEMB_HD DYNEMB_INLINE void unit_pair(uint64_t r, float* u0, float* u1) {
  *u0 = unit_of(static_cast<uint32_t>(r));
  *u1 = unit_of(static_cast<uint32_t>(r >> 32));
}

/// Standard normal pair (Box-Muller) from one 64-bit draw.
DYNEMB_HD DYNEMB_INLINE void normal_pair(uint64_t r, float* z0, float* z1) {
  float u0, u1;
  unit_pair(r, &u0, &u1);
  const float radius = sqrtf(-2.0f * logf(1.0f - u0));  // 1 - u0 in (0, 1]: log is finite
  const float angle = 6.283185307179586f * u1;
  *z0 = radius * cosf(angle);
  *z1 = radius * sinf(angle);
}

/// The stream of 64-bit draws for one key: draw(c) for c = 0, 1, 2, ...
DYNEMB_HD DYNEMB_INLINE uint64_t draw(uint64_t stream, uint64_t c) {
  return mix64(stream + (c + 1) * 0x9E3779B97F4A7C15ULL);
}

/// Draw c of the 32-bit stream of one key: murmur3's fmix32 of the counter offset
/// by the stream's low word, with the high word added between its two multiplies
/// (so the row depends on all 64 bits of the stream).
DYNEMB_HD DYNEMB_INLINE uint32_t draw32(uint64_t stream, uint32_t c) {
  uint32_t x = static_cast<uint32_t>(stream) + (c + 1u) * 0x9E3779B9u;
  x ^= x >> 16;
  x *= 0x85EBCA6Bu;
  x ^= x >> 13;
  x += static_cast<uint32_t>(stream >> 32);
  x *= 0xC2B2AE35u;
  x ^= x >> 16;
  return x;
}

DYNEMB_HD DYNEMB_INLINE uint64_t stream_of(uint64_t seed, int64_t key) {
  return mix64(static_cast<uint64_t>(key) ^ mix64(seed ^ 0x5851F42D4C957F2DULL));
}

/// Column j of the initial (whole) row of `key` (stream = stream_of(seed, key)).
/// init_row produces the same values (the normal modes: two elements per draw).
DYNEMB_HD DYNEMB_INLINE float init_element(const InitArgs& a, uint64_t stream, int64_t key,
                                           int64_t j) {
  switch (a.mode) {
    case InitMode::kUniform:
      return a.a + (a.b - a.a) * unit_of(draw32(stream, static_cast<uint32_t>(j)));
    case InitMode::kNormal: {
      float z0, z1;
      normal_pair(draw(stream, static_cast<uint64_t>(j >> 1)), &z0, &z1);
      return a.a + a.b * ((j & 1) ? z1 : z0);
    }
    case InitMode::kTruncatedNormal: {
      // Rejection sampling on element j's own counters; after 64 rejections
      // (negligible for bounds within a few std devs) the value is clamped.
      float v = a.a;
      for (uint64_t attempt = 0; attempt < 64; ++attempt) {
        float z0, z1;
        normal_pair(draw(stream, (static_cast<uint64_t>(j) << 6) + attempt), &z0, &z1);
        v = a.a + a.b * z0;
        if (v >= a.lower && v <= a.upper) return v;
      }
      return fminf(fmaxf(v, a.lower), a.upper);
    }
    case InitMode::kConstant: return a.a;
    case InitMode::kDebug:
      return static_cast<float>(static_cast<uint64_t>(key) % kDebugModulus);
  }
  return 0.0f;
}

/// The part of a row one caller moves: lane `first` of a tile of `stride` lanes
/// (core/bucket_tile.h) owns the row's 16-byte chunks first, first + stride, ...
/// (row_chunk: 4 floats or 8 halves each, the last one maybe partial), so a tile of 8
/// lanes moves 128 bytes of a row per step, a 16-byte vector move per lane. Every move
/// of a row by a tile (copy_row, init_row with Lanes) gives an element to the same
/// lane, whatever the addresses' alignment: a lane that reads a row and then
/// overwrites it (a cache exchange) touches only its own elements. The lead lane
/// (first 0) also writes a key's scalar outputs (batch_sinks.h).
struct Lanes {
  int64_t first;
  int64_t stride;
  DYNEMB_HD bool lead() const { return first == 0; }
};

/// Elements of V in a 16-byte chunk of a row (Lanes).
template <typename V>
constexpr int64_t row_chunk() {
  static_assert(16 % sizeof(V) == 0, "a row chunk holds whole elements");
  return static_cast<int64_t>(16 / sizeof(V));
}

/// Calls f(j, m) for the chunks of a row of n elements that lane `l` owns: elements
/// j .. j + m (m = row_chunk<V>(), less in a partial last chunk), in ascending j.
template <typename V, typename F>
DYNEMB_HD DYNEMB_INLINE void for_lane_chunks(int64_t n, Lanes l, F&& f) {
  constexpr int64_t kChunk = row_chunk<V>();
  for (int64_t j = l.first * kChunk; j < n; j += l.stride * kChunk) {
    f(j, n - j < kChunk ? n - j : kChunk);
  }
}

/// Writes a new row: out[j] for j < dim from the initializer, then the extra
/// columns (j < row_width) at extra_element.
template <typename V>
DYNEMB_HD void init_row(const InitArgs& a, int64_t key, V* out, int64_t dim, int64_t row_width) {
  const uint64_t stream = stream_of(a.seed, key);
  const int64_t first = a.column_offset;
  if (a.mode == InitMode::kUniform) {
    // One draw per element, in a loop without branches that compilers vectorise; the
    // bounds live in locals because stores to out might otherwise alias them.
    const float lo = a.a;
    const float span = a.b - a.a;
    // A 32-bit counter: the draws' lanes are 32 bits, no 64-bit index to narrow.
    const uint32_t n = static_cast<uint32_t>(dim);
    const uint32_t c0 = static_cast<uint32_t>(first);
    for (uint32_t j = 0; j < n; ++j) {
      out[j] = static_cast<V>(lo + span * unit_of(draw32(stream, c0 + j)));
    }
  } else if (a.mode == InitMode::kNormal && (first & 1) == 0) {
    // One Box-Muller draw serves two columns (a pair never straddles an even offset).
    for (int64_t j = 0; j < dim; j += 2) {
      float z0, z1;
      normal_pair(draw(stream, static_cast<uint64_t>((first + j) >> 1)), &z0, &z1);
      out[j] = static_cast<V>(a.a + a.b * z0);
      if (j + 1 < dim) out[j + 1] = static_cast<V>(a.a + a.b * z1);
    }
  } else {
    for (int64_t j = 0; j < dim; ++j) {
      out[j] = static_cast<V>(init_element(a, stream, key, first + j));
    }
  }
  for (int64_t j = dim; j < row_width; ++j) out[j] = static_cast<V>(extra_element(a, j - dim));
}

/// init_row's elements in the chunks lane `l` owns (for_lane_chunks): the same values,
/// so the lanes of a tile write a row together. A lane computes the Box-Muller pair of
/// each of its elements (its neighbour in the pair may belong to another lane).
template <typename V>
DYNEMB_HD void init_row(const InitArgs& a, int64_t key, V* out, int64_t dim, int64_t row_width,
                        Lanes l) {
  if (l.stride == 1) return init_row(a, key, out, dim, row_width);
  const uint64_t stream = stream_of(a.seed, key);
  for_lane_chunks<V>(row_width, l, [&](int64_t j0, int64_t m) DYNEMB_INLINE_LAMBDA {
    for (int64_t j = j0; j < j0 + m; ++j) {
      out[j] = static_cast<V>(j >= dim ? extra_element(a, j - dim)
                                       : init_element(a, stream, key, a.column_offset + j));
    }
  });
}

/// init_row by lanes that also writes each of its elements j < copy_width to copy[j],
/// from the same register: a new key's row goes to the table and to the caller's
/// output without the table row being read back.
template <typename V>
DYNEMB_HD void init_row(const InitArgs& a, int64_t key, V* out, int64_t dim, int64_t row_width,
                        Lanes l, V* copy, int64_t copy_width) {
  const uint64_t stream = stream_of(a.seed, key);
  for_lane_chunks<V>(row_width, l, [&](int64_t j0, int64_t m) DYNEMB_INLINE_LAMBDA {
    for (int64_t j = j0; j < j0 + m; ++j) {
      const V v = static_cast<V>(j >= dim ? extra_element(a, j - dim)
                                          : init_element(a, stream, key, a.column_offset + j));
      out[j] = v;
      if (j < copy_width) copy[j] = v;
    }
  });
}

}  // namespace dynemb
