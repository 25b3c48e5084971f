// dynemb core: 8-bit rows of a serving table and their pooled and sequence lookups.
//
// A quantized table holds, per slot, `row_bytes` bytes: dim codes, then float32
// parameters (fbgemm's fused rowwise order: codes first):
//   INT8: code q in [0, 255], then scale, bias;  element = fmaf(q, scale, bias)
//   E4M3: code = a float8 e4m3fn (OCP FP8: 1 sign, 4 exponent bits of bias 7, 3
//         mantissa bits; no infinity, 0x7F / 0xFF are NaN), then scale;
//         element = scale * e4m3_value(code)
// float32 (not fp16) parameters: an fp16 bias of a row far from zero errs by more than
// half a step (scale / 2), which would break the int8 error bound.
//
// An element is decoded by one rule everywhere (one fmaf or one multiply, each
// rounded once), then pooled as pooling.h pools float rows: acc = fmaf(w, x, acc) in
// index order from +0, MEAN then times 1.0f / len. So every executor gives the same bits.
// Keys without a slot pool the `missing` initializer's row (not quantized).
#pragma once

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "core/pooling.h"

namespace dynemb {

enum class RowFormat : int64_t { kInt8 = 0, kE4M3 = 1 };
/// Number of RowFormat values (codes 0 .. kRowFormatCount - 1).
constexpr int64_t kRowFormatCount = static_cast<int64_t>(RowFormat::kE4M3) + 1;
/// Their names, by code.
constexpr const char* kRowFormatNames[kRowFormatCount] = {"INT8", "E4M3"};

/// Bytes of a row of `dim` elements: the codes and the float32 parameters.
DYNEMB_HD DYNEMB_INLINE int64_t quantized_row_bytes(RowFormat format, int64_t dim) {
  return dim + (format == RowFormat::kInt8 ? 8 : 4);
}

/// The float of an e4m3fn code, exactly (every e4m3 value is a float32): its bits are
/// built, so no table and no rounding; NaN for 0x7F and 0xFF.
DYNEMB_HD DYNEMB_INLINE float e4m3_value(uint8_t code) {
  const uint32_t sign = static_cast<uint32_t>(code & 0x80) << 24;
  const uint32_t exponent = (code >> 3) & 0xF, mantissa = code & 0x7;
  uint32_t bits;
  if (exponent == 0xF && mantissa == 0x7) {
    bits = sign | 0x7FC00000u;
  } else if (exponent == 0) {  // zero or subnormal: mantissa * 2^-9, exact in float
    const float magnitude = static_cast<float>(mantissa) * 0.001953125f;
    memcpy(&bits, &magnitude, sizeof(bits));
    bits |= sign;
  } else {  // (1 + mantissa / 8) * 2^(exponent - 7)
    bits = sign | ((exponent - 7 + 127) << 23) | (mantissa << 20);
  }
  float out;
  memcpy(&out, &bits, sizeof(out));
  return out;
}

/// A quantized table's rows, by slot.
struct QuantizedRows {
  const uint8_t* bytes;  // (num_slots, row_bytes)
  int64_t row_bytes;
  RowFormat format;
};

/// The decoder of one row: its parameters read once.
struct QuantizedRow {
  const uint8_t* codes;
  float scale;
  float bias;  // 0 for E4M3 (unused)
  RowFormat format;

  DYNEMB_HD DYNEMB_INLINE float operator[](int64_t j) const {
    if (format == RowFormat::kInt8) return fmaf(static_cast<float>(codes[j]), scale, bias);
    return scale * e4m3_value(codes[j]);
  }
};

/// The row of `slot` (dim codes, then the parameters; read unaligned: any dim).
DYNEMB_HD DYNEMB_INLINE QuantizedRow quantized_row(const QuantizedRows& r, int64_t slot,
                                                   int64_t dim) {
  QuantizedRow row{r.bytes + slot * r.row_bytes, 0.0f, 0.0f, r.format};
  memcpy(&row.scale, row.codes + dim, sizeof(float));
  if (r.format == RowFormat::kInt8) memcpy(&row.bias, row.codes + dim + 4, sizeof(float));
  return row;
}

/// out (dim floats) = the pooled bag [begin, end): pool_bag's rule over decoded rows.
DYNEMB_HD DYNEMB_INLINE void pool_quantized_bag(const QuantizedRows& r, const int64_t* slots,
                                                const int64_t* keys, const float* weights,
                                                int64_t begin, int64_t end, PoolingMode mode,
                                                const InitArgs& missing, float* out,
                                                int64_t dim) {
  for (int64_t j = 0; j < dim; ++j) out[j] = 0.0f;
  for (int64_t i = begin; i < end; ++i) {
    const float w = weights ? weights[i] : 1.0f;
    if (slots[i] >= 0) {
      const QuantizedRow row = quantized_row(r, slots[i], dim);
      for (int64_t j = 0; j < dim; ++j) out[j] = fmaf(w, row[j], out[j]);
    } else {
      for (int64_t j = 0; j < dim; ++j) out[j] = fmaf(w, missing_element(missing, keys[i], j), out[j]);
    }
  }
  if (mode == PoolingMode::kMean && end > begin) {
    const float inv = 1.0f / static_cast<float>(end - begin);
    for (int64_t j = 0; j < dim; ++j) out[j] *= inv;
  }
}

/// Element j of pool_quantized_bag's out: the same terms in the same order (a GPU lane
/// per element).
DYNEMB_HD DYNEMB_INLINE float pool_quantized_element(const QuantizedRows& r,
                                                     const int64_t* slots, const int64_t* keys,
                                                     const float* weights, int64_t begin,
                                                     int64_t end, PoolingMode mode,
                                                     const InitArgs& missing, int64_t j,
                                                     int64_t dim) {
  float acc = 0.0f;
  for (int64_t i = begin; i < end; ++i) {
    const float w = weights ? weights[i] : 1.0f;
    const float x = slots[i] >= 0 ? quantized_row(r, slots[i], dim)[j]
                                  : missing_element(missing, keys[i], j);
    acc = fmaf(w, x, acc);
  }
  if (mode == PoolingMode::kMean && end > begin) acc *= 1.0f / static_cast<float>(end - begin);
  return acc;
}

/// Element j of index i's decoded row (sequence lookup).
DYNEMB_HD DYNEMB_INLINE float gather_quantized_element(const QuantizedRows& r,
                                                       const int64_t* slots, const int64_t* keys,
                                                       int64_t i, const InitArgs& missing,
                                                       int64_t j, int64_t dim) {
  return slots[i] >= 0 ? quantized_row(r, slots[i], dim)[j]
                       : missing_element(missing, keys[i], j);
}

}  // namespace dynemb
