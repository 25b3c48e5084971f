// dynemb CPU executor: see quantized_cpu.h. Bags (or indices) split among the threads.
//
// A bag is pooled by core pool_quantized_bag's rule, with the row format a template
// argument (no branch per element, so the int8 loop vectorises) and the e4m3 codes
// decoded through a 256-entry table filled by core e4m3_value: the same operations on
// the same values as core, so the same bits (tests/inference/test_quantized_rows.py
// compares with the emulated CUDA executor, which runs core's loops).
#include "cpu/quantized_cpu.h"

#include <ATen/Parallel.h>

#include <vector>

namespace dynemb::cpu {

namespace {
constexpr int64_t kBagGrain = 64;
constexpr int64_t kRowGrain = 256;

struct E4M3Table {
  float value[256];
  E4M3Table() {
    for (int c = 0; c < 256; ++c) value[c] = e4m3_value(static_cast<uint8_t>(c));
  }
};
const E4M3Table kE4M3;

/// acc[j] = fmaf(w, element j of the row, acc[j]) for j < dim (core QuantizedRow's decode).
template <RowFormat F>
DYNEMB_INLINE void add_row(const QuantizedRow& row, float w, float* acc, int64_t dim) {
  const uint8_t* codes = row.codes;
  if constexpr (F == RowFormat::kInt8) {
    const float scale = row.scale, bias = row.bias;
    for (int64_t j = 0; j < dim; ++j) {
      acc[j] = fmaf(w, fmaf(static_cast<float>(codes[j]), scale, bias), acc[j]);
    }
  } else {
    const float scale = row.scale;
    for (int64_t j = 0; j < dim; ++j) acc[j] = fmaf(w, scale * kE4M3.value[codes[j]], acc[j]);
  }
}

template <RowFormat F>
void pool_bags(const QuantizedRows& r, const int64_t* slots, const int64_t* keys,
               const int64_t* offsets, const float* weights, PoolingMode mode,
               const InitArgs& missing, float* out, int64_t dim, int64_t b0, int64_t b1) {
  thread_local std::vector<float> scratch;
  if (static_cast<int64_t>(scratch.size()) < dim) scratch.resize(static_cast<size_t>(dim));
  float* const acc = scratch.data();  // summed here, then stored: out may be far
  for (int64_t b = b0; b < b1; ++b) {
    const int64_t begin = offsets[b], end = offsets[b + 1];
    for (int64_t j = 0; j < dim; ++j) acc[j] = 0.0f;
    for (int64_t i = begin; i < end; ++i) {
      const float w = weights ? weights[i] : 1.0f;
      if (slots[i] >= 0) {
        add_row<F>(quantized_row(r, slots[i], dim), w, acc, dim);
      } else {
        for (int64_t j = 0; j < dim; ++j) acc[j] = fmaf(w, missing_element(missing, keys[i], j), acc[j]);
      }
    }
    if (mode == PoolingMode::kMean && end > begin) {
      const float inv = 1.0f / static_cast<float>(end - begin);
      for (int64_t j = 0; j < dim; ++j) acc[j] *= inv;
    }
    float* const o = out + b * dim;
    for (int64_t j = 0; j < dim; ++j) o[j] = acc[j];
  }
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

void gather_quantized(const QuantizedRows& r, const int64_t* slots, const int64_t* keys,
                      int64_t n, const InitArgs& missing, float* out, int64_t dim) {
  at::parallel_for(0, n, kRowGrain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      float* row = out + i * dim;
      if (slots[i] >= 0) {
        const QuantizedRow q = quantized_row(r, slots[i], dim);
        for (int64_t j = 0; j < dim; ++j) row[j] = q[j];
      } else {
        for (int64_t j = 0; j < dim; ++j) row[j] = missing_element(missing, keys[i], j);
      }
    }
  });
}

}  // namespace dynemb::cpu
