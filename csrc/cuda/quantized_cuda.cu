// dynemb CUDA executor: lookups of 8-bit rows over core/quantized_rows.h; launch
// geometry only (kRowLanes threads per bag or index, a lane per element).
#include "cuda/kernel_common.cuh"
#include "cuda/launchers_quantized_cuda.h"

namespace dynemb::DYNEMB_CUDA_NS {
namespace {

__global__ void pool_quantized_kernel(QuantizedRows r, const int64_t* slots, const int64_t* keys,
                                      const int64_t* offsets, const float* weights,
                                      int64_t num_bags, PoolingMode mode, InitArgs missing,
                                      float* out, int64_t dim) {
  const int64_t b = thread_index() / kRowLanes;
  if (b >= num_bags) return;
  for (int64_t j = thread_index() % kRowLanes; j < dim; j += kRowLanes) {
    out[b * dim + j] = pool_quantized_element(r, slots, keys, weights, offsets[b],
                                              offsets[b + 1], mode, missing, j, dim);
  }
}

__global__ void gather_quantized_kernel(QuantizedRows r, const int64_t* slots, const int64_t* keys,
                                        int64_t n, InitArgs missing, float* out, int64_t dim) {
  const int64_t i = thread_index() / kRowLanes;
  if (i >= n) return;
  for (int64_t j = thread_index() % kRowLanes; j < dim; j += kRowLanes) {
    out[i * dim + j] = gather_quantized_element(r, slots, keys, i, missing, j, dim);
  }
}

}  // namespace

void launch_pool_quantized(const QuantizedRows& r, const int64_t* slots, const int64_t* keys,
                           const int64_t* offsets, const float* weights, int64_t num_bags,
                           PoolingMode mode, const InitArgs& missing, float* out, int64_t dim,
                           cudaStream_t stream) {
  if (num_bags == 0) return;
  DYNEMB_LAUNCH(blocks_for(num_bags * kRowLanes), kBlock, stream, pool_quantized_kernel)(
      r, slots, keys, offsets, weights, num_bags, mode, missing, out, dim);
}

void launch_gather_quantized(const QuantizedRows& r, const int64_t* slots, const int64_t* keys,
                             int64_t n, const InitArgs& missing, float* out, int64_t dim,
                             cudaStream_t stream) {
  if (n == 0) return;
  DYNEMB_LAUNCH(blocks_for(n * kRowLanes), kBlock, stream, gather_quantized_kernel)(
      r, slots, keys, n, missing, out, dim);
}

}  // namespace dynemb::DYNEMB_CUDA_NS
