// dynemb CUDA executor: the Tile of core/bucket_tile.h for device lanes, over a
// cooperative-groups tile of N threads of a warp (also in emulation: the shim's tiles
// meet in lockstep).
#pragma once

#include <type_traits>

#include "core/bucket_tile.h"
#include "cuda/runtime.cuh"

namespace dynemb::DYNEMB_CUDA_NS {

/// N consecutive threads of a warp (thread x is lane x % N of tile x / N).
template <unsigned N>
struct CgTile {
  static constexpr int kSize = static_cast<int>(N);
  cooperative_groups::thread_block_tile<N> g;

  __device__ CgTile()
      : g(cooperative_groups::tiled_partition<N>(cooperative_groups::this_thread_block())) {}
  __device__ int rank() const { return static_cast<int>(g.thread_rank()); }
  __device__ uint32_t ballot(bool vote) const { return g.ballot(vote); }
  template <class T>
  __device__ T shfl(T v, int src) const {
    return g.shfl(v, src);
  }
  /// A butterfly: log2(N) shuffles, every lane ends with the minimum.
  __device__ uint64_t min(uint64_t v) const {
#pragma unroll
    for (unsigned d = N / 2; d > 0; d /= 2) {
      const uint64_t other = g.shfl_xor(v, d);
      v = other < v ? other : v;
    }
    return v;
  }
  __device__ void sync() const { g.sync(); }
  /// core match_chunk: one kBytes vector load, of a kBytes-aligned address.
  template <int kBytes>
  __device__ uint32_t match(const uint8_t* digests, uint8_t digest) const {
    DYNEMB_VECTOR_LOAD(digests, kBytes);
    return match_chunk<kBytes>(digests, digest);
  }
};

/// Lanes per key of a kernel that copies rows of `width` elements: 8 for width <= 8,
/// 16 for <= 16, else 32, so that a narrow row leaves no lane of its tile idle.
inline int row_tile_lanes(int64_t width) { return width <= 8 ? 8 : width <= 16 ? 16 : 32; }

/// Calls launch(std::integral_constant<unsigned, row_tile_lanes(width)>{}): a kernel
/// templated on its tile's lanes, launched for a runtime width.
template <class Launch>
void with_row_tile(int64_t width, Launch&& launch) {
  switch (row_tile_lanes(width)) {
    case 8: launch(std::integral_constant<unsigned, 8>{}); break;
    case 16: launch(std::integral_constant<unsigned, 16>{}); break;
    default: launch(std::integral_constant<unsigned, 32>{});
  }
}

}  // namespace dynemb::DYNEMB_CUDA_NS
