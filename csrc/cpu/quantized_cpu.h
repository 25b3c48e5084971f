// dynemb CPU executor: lookups of 8-bit rows (core/quantized_rows.h).
#pragma once

#include <cstdint>

#include "core/quantized_rows.h"

namespace dynemb::cpu {

/// out (num_bags, dim) float: each bag [offsets[b], offsets[b + 1]) pooled.
void pool_quantized(const QuantizedRows& r, const int64_t* slots, const int64_t* keys,
                    const int64_t* offsets, const float* weights, int64_t num_bags,
                    PoolingMode mode, const InitArgs& missing, float* out, int64_t dim);

/// out (n, dim) float: the decoded row of each index.
void gather_quantized(const QuantizedRows& r, const int64_t* slots, const int64_t* keys,
                      int64_t n, const InitArgs& missing, float* out, int64_t dim);

}  // namespace dynemb::cpu
