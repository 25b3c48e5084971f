// dynemb CPU executor: see quantized_cpu.h. Bags (or indices) split among the threads;
// each bag pooled by core pool_quantized_bag.
#include "cpu/quantized_cpu.h"

#include <ATen/Parallel.h>

namespace dynemb::cpu {

namespace {
constexpr int64_t kBagGrain = 64;
constexpr int64_t kRowGrain = 256;
}  // namespace

void pool_quantized(const QuantizedRows& r, const int64_t* slots, const int64_t* keys,
                    const int64_t* offsets, const float* weights, int64_t num_bags,
                    PoolingMode mode, const InitArgs& missing, float* out, int64_t dim) {
  at::parallel_for(0, num_bags, kBagGrain, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      pool_quantized_bag(r, slots, keys, weights, offsets[b], offsets[b + 1], mode, missing,
                         out + b * dim, dim);
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
