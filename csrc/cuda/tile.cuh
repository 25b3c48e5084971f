// dynemb CUDA executor: the Tile of core/bucket_tile.h for device lanes, over a
// cooperative-groups tile of N threads of a warp (also in emulation: the shim's tiles
// meet in lockstep).
#pragma once

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
  /// The sum of v over the lanes, in every lane (a butterfly, as min).
  __device__ uint64_t sum(uint64_t v) const {
#pragma unroll
    for (unsigned d = N / 2; d > 0; d /= 2) v += g.shfl_xor(v, d);
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

/// Lanes per key of the kernels that move rows (find, the upserts, rehash, the cache
/// exchange), whatever the row width: a warp serves 4 keys. Each lane moves a row 16
/// bytes at a time (core Lanes: 128 bytes of the row per step of the tile), and reads a
/// 128-slot bucket's digests in one 16-byte load. The kernels take it as their template
/// argument N; the core's tile scans and row moves are tested at 8, 16 and 32 lanes
/// (tests/native/tile_bucket.cpp).
constexpr unsigned kRowTileLanes = 8;

}  // namespace dynemb::DYNEMB_CUDA_NS
