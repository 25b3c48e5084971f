// dynemb CPU executor: see quantized_cpu.h. Bags (or indices) split among the threads.
//
// A bag is pooled by core pool_quantized_bag's rule with the row format a template
// argument. Bags of stored keys at a dim with a register kernel (cpu/row_lanes.h: 8,
// 16, ..., 128) are summed in registers, 8 elements a step: int8 decoded by one fused
// multiply-add (core's fmaf(q, scale, bias)), e4m3 by core e4m3_value's bit rule in
// vector registers (without AVX2: a 256-entry table filled by e4m3_value), times the
// scale; each term added by one fused multiply-add, as core.
// Other bags take core's loop. The same operations on the same values, so the same bits
// (tests/inference/test_quantized_rows.py compares with the emulated CUDA executor).
// (libm's fmaf, called per element where the build cannot inline it, ran 6-9x slower
// than the float tables' pooling.)
#include "cpu/quantized_cpu.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <vector>

#include "cpu/cpu_platform.h"
#include "cpu/row_lanes.h"

namespace dynemb::cpu {

namespace {
constexpr int64_t kBagGrain = 64;
constexpr int64_t kRowGrain = 256;
// Indices past the current bag whose rows are prefetched (embedding_cpu.cpp's
// kRowDistance): a served table's rows are far beyond the caches.
constexpr int64_t kRowDistance = 16;

struct E4M3Table {
  float value[256];
  E4M3Table() {
    for (int c = 0; c < 256; ++c) value[c] = e4m3_value(static_cast<uint8_t>(c));
  }
};
const E4M3Table kE4M3;

/// Elements 8c .. 8c + 7 of a row, decoded (core QuantizedRow's rule).
template <RowFormat F>
DYNEMB_INLINE Lane8 decode8(const QuantizedRow& row, int64_t c) {
  const uint8_t* codes = row.codes + 8 * c;
  if constexpr (F == RowFormat::kInt8) {
#if defined(__AVX2__) && defined(__FMA__)
    const __m256 q = _mm256_cvtepi32_ps(
        _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(codes))));
    return reinterpret_cast<Lane8>(
        _mm256_fmadd_ps(q, _mm256_set1_ps(row.scale), _mm256_set1_ps(row.bias)));
#else
    Lane8 x;
    for (int l = 0; l < 8; ++l) x[l] = fmaf(static_cast<float>(codes[l]), row.scale, row.bias);
    return x;
#endif
  } else {
#if defined(__AVX2__)
    // core e4m3_value's bits, 8 at a time: a normal code's float has exponent e + 120
    // and the 3 mantissa bits on top; a subnormal's is m * 2^-9; 0x7F is NaN; the sign
    // or-ed in last.
    const __m256i x = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(codes)));
    const __m256i magnitude = _mm256_and_si256(x, _mm256_set1_epi32(0x7F));
    const __m256 normal = _mm256_castsi256_ps(
        _mm256_add_epi32(_mm256_slli_epi32(magnitude, 20), _mm256_set1_epi32(120 << 23)));
    const __m256 subnormal = _mm256_mul_ps(
        _mm256_cvtepi32_ps(_mm256_and_si256(x, _mm256_set1_epi32(0x7))), _mm256_set1_ps(0.001953125f));
    const __m256i exponent = _mm256_and_si256(x, _mm256_set1_epi32(0x78));
    __m256 v = _mm256_blendv_ps(
        normal, subnormal,
        _mm256_castsi256_ps(_mm256_cmpeq_epi32(exponent, _mm256_setzero_si256())));
    v = _mm256_blendv_ps(
        v, _mm256_castsi256_ps(_mm256_set1_epi32(0x7FC00000)),
        _mm256_castsi256_ps(_mm256_cmpeq_epi32(magnitude, _mm256_set1_epi32(0x7F))));
    v = _mm256_or_ps(v, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_and_si256(x, _mm256_set1_epi32(0x80)), 24)));
    return reinterpret_cast<Lane8>(_mm256_mul_ps(v, _mm256_set1_ps(row.scale)));
#else
    Lane8 v;
    for (int l = 0; l < 8; ++l) v[l] = kE4M3.value[codes[l]];
    return v * row.scale;
#endif
  }
}

/// Bag b pooled in registers (kDim floats) into out; false, nothing written, when an
/// index of the bag has no stored row (core's loop draws its missing row).
template <RowFormat F, int64_t kDim>
DYNEMB_INLINE bool pool_stored_bag(const QuantizedRows& r, const int64_t* slots,
                                   const float* weights, int64_t begin, int64_t end,
                                   PoolingMode mode, float* out) {
  auto sum = LaneRow<kDim>::zeros();
  for (int64_t i = begin; i < end; ++i) {
    if (slots[i] < 0) return false;
    const float w = weights ? weights[i] : 1.0f;
    const QuantizedRow row = quantized_row(r, slots[i], kDim);
    DYNEMB_UNROLL_LANES
    for (int64_t c = 0; c < LaneRow<kDim>::kLanes; ++c) {
      sum.lane[c] = fma8(w, decode8<F>(row, c), sum.lane[c]);
    }
  }
  if (mode == PoolingMode::kMean && end > begin) sum.scale(1.0f / static_cast<float>(end - begin));
  sum.store(out);
  return true;
}

template <RowFormat F>
void pool_bags(const QuantizedRows& r, const int64_t* slots, const int64_t* keys,
               const int64_t* offsets, const float* weights, PoolingMode mode,
               const InitArgs& missing, float* out, int64_t dim, int64_t b0, int64_t b1) {
  auto generic = [&](int64_t b) {
    pool_quantized_bag(r, slots, keys, weights, offsets[b], offsets[b + 1], mode, missing,
                       out + b * dim, dim);
  };
  const bool done = with_lane_dim(dim, [&](auto lane_dim) {
    constexpr int64_t kDim = decltype(lane_dim)::value;
    const int64_t last = offsets[b1];
    int64_t ahead = offsets[b0];
    for (int64_t b = b0; b < b1; ++b) {
      for (const int64_t until = std::min(offsets[b + 1] + kRowDistance, last); ahead < until;
           ++ahead) {
        if (slots[ahead] >= 0) CpuPlatform::prefetch_lines(r.bytes + slots[ahead] * r.row_bytes, r.row_bytes);
      }
      if (!pool_stored_bag<F, kDim>(r, slots, weights, offsets[b], offsets[b + 1], mode,
                                    out + b * kDim)) {
        generic(b);
      }
    }
  });
  if (done) return;
  for (int64_t b = b0; b < b1; ++b) generic(b);
}

}  // namespace

void pool_quantized(const QuantizedRows& r, const int64_t* slots, const int64_t* keys,
                    const int64_t* offsets, const float* weights, int64_t num_bags,
                    PoolingMode mode, const InitArgs& missing, float* out, int64_t dim) {
  at::parallel_for(0, num_bags, kBagGrain, [&](int64_t begin, int64_t end) {
    if (r.format == RowFormat::kInt8) {
      pool_bags<RowFormat::kInt8>(r, slots, keys, offsets, weights, mode, missing, out, dim,
                                  begin, end);
    } else {
      pool_bags<RowFormat::kE4M3>(r, slots, keys, offsets, weights, mode, missing, out, dim,
                                  begin, end);
    }
  });
}

namespace {

/// Rows [i0, i1) decoded into out: 8 elements a step at the register dims (decode8),
/// else core's gather_quantized_element.
template <RowFormat F>
void gather_rows(const QuantizedRows& r, const int64_t* slots, const int64_t* keys,
                 const InitArgs& missing, float* out, int64_t dim, int64_t i0, int64_t i1) {
  auto generic = [&](int64_t i) {
    for (int64_t j = 0; j < dim; ++j) {
      out[i * dim + j] = gather_quantized_element(r, slots, keys, i, missing, j, dim);
    }
  };
  const bool done = with_lane_dim(dim, [&](auto lane_dim) {
    constexpr int64_t kDim = decltype(lane_dim)::value;
    for (int64_t i = i0; i < i1; ++i) {
      if (slots[i] < 0) {
        generic(i);
        continue;
      }
      const QuantizedRow row = quantized_row(r, slots[i], kDim);
      DYNEMB_UNROLL_LANES
      for (int64_t c = 0; c < LaneRow<kDim>::kLanes; ++c) {
        *reinterpret_cast<UnalignedLane8*>(out + i * kDim + 8 * c) = decode8<F>(row, c);
      }
    }
  });
  if (done) return;
  for (int64_t i = i0; i < i1; ++i) generic(i);
}

}  // namespace

void gather_quantized(const QuantizedRows& r, const int64_t* slots, const int64_t* keys,
                      int64_t n, const InitArgs& missing, float* out, int64_t dim) {
  at::parallel_for(0, n, kRowGrain, [&](int64_t begin, int64_t end) {
    if (r.format == RowFormat::kInt8) {
      gather_rows<RowFormat::kInt8>(r, slots, keys, missing, out, dim, begin, end);
    } else {
      gather_rows<RowFormat::kE4M3>(r, slots, keys, missing, out, dim, begin, end);
    }
  });
}

}  // namespace dynemb::cpu
