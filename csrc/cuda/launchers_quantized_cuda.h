// dynemb CUDA executor: the launchers of lookups of 8-bit rows (core/quantized_rows.h).
// Device pointers; enqueued on `stream`, no synchronisation.
#pragma once

#include <cstdint>

#include "core/quantized_rows.h"
#include "cuda/runtime.cuh"

namespace dynemb::DYNEMB_CUDA_NS {

/// out (num_bags, dim) float: each bag pooled (core pool_quantized_element).
void launch_pool_quantized(const QuantizedRows& r, const int64_t* slots, const int64_t* keys,
                           const int64_t* offsets, const float* weights, int64_t num_bags,
                           PoolingMode mode, const InitArgs& missing, float* out, int64_t dim,
                           cudaStream_t stream);

/// out (n, dim) float: the decoded row of each index.
void launch_gather_quantized(const QuantizedRows& r, const int64_t* slots, const int64_t* keys,
                             int64_t n, const InitArgs& missing, float* out, int64_t dim,
                             cudaStream_t stream);

}  // namespace dynemb::DYNEMB_CUDA_NS
