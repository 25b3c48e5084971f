// dynemb core: what the algorithm needs from a device (the Platform concept).
//
// The core code that needs more than plain arithmetic is templated on a Platform type
// and calls only the static functions below: the batch de-duplication set's atomics
// (dedup.h) and the CPU's prefetch of a likely slot (bucket.h likely_slot). A bucket's
// scans compare digests by their tile's match (bucket_tile.h), which is match_chunk
// below on every executor. Two platforms exist: CpuPlatform (csrc/cpu/cpu_platform.h,
// std::atomic_ref, SSE2) and CudaPlatform (csrc/cuda/cuda_platform.cuh, atomicCAS,
// match_chunk's 16-byte loads and SWAR compares).
//
//   struct Platform {
//     // Bit j set when group[j] == digest, for the 16 bytes at group (16-aligned).
//     static uint32_t match16(const uint8_t* group, uint8_t digest);
//     // Hint that addr will be read soon (no-op where there is no such hint).
//     static void prefetch(const void* addr);
//     // 32-bit atomics of the batch de-duplication set (core/dedup.h). Memory order:
//     // load32 ACQUIRE and store32 RELEASE (a thread that reads kReadyCell from load32
//     // must then see the key the claiming thread wrote before its store32: a relaxed
//     // load32 is a data race on the cell's key, as ThreadSanitizer showed on the CUDA
//     // platform); cas32 and fetch_add32 may be relaxed (CudaPlatform's are: CUDA's
//     // atomicCAS and atomicAdd).
//     static int32_t load32(int32_t*); static void store32(int32_t*, int32_t);
//     static int32_t cas32(int32_t*, int32_t expected, int32_t desired);  // returns old
//     static int32_t fetch_add32(int32_t*, int32_t);
//   };
//
// No op takes a bucket lock: a batch op that changes the table runs each bucket's keys
// on the one thread or tile that owns the bucket (table_ops.h "Batch rule"), and
// read-only ops never run beside a writer: the Python owner of a table sees to that
// (dynemb/table/rw_lock.py).
#pragma once

#include "core/macros.h"

#if !defined(__CUDA_ARCH__)
#include <cstring>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif
#endif

namespace dynemb {

/// Portable 16-lane digest compare, used by platforms without byte SIMD.
DYNEMB_HD DYNEMB_INLINE uint32_t match16_scalar(const uint8_t* group, uint8_t digest) {
  uint32_t mask = 0;
#pragma unroll
  for (int j = 0; j < 16; ++j) {
    mask |= static_cast<uint32_t>(group[j] == digest) << j;
  }
  return mask;
}

/// Bit j set when byte j of `word` equals `digest` (exact: no carries between bytes).
DYNEMB_HD DYNEMB_INLINE uint32_t match4(uint32_t word, uint8_t digest) {
  const uint32_t x = word ^ (0x01010101u * digest);  // a zero byte where equal
  const uint32_t zero = ~((((x & 0x7F7F7F7Fu) + 0x7F7F7F7Fu) | x) | 0x7F7F7F7Fu);
  return ((zero >> 7) & 1u) | ((zero >> 14) & 2u) | ((zero >> 21) & 4u) | ((zero >> 28) & 8u);
}

/// Bit j set when digests[j] == digest, for the kBytes bytes at `digests` (aligned
/// to kBytes: buckets are 16-slot groups of 64-byte aligned buffers), read in one load.
template <int kBytes>
DYNEMB_HD DYNEMB_INLINE uint32_t match_chunk(const uint8_t* digests, uint8_t digest) {
  uint32_t w[kBytes / 4];
#if defined(__CUDA_ARCH__)
  if constexpr (kBytes == 16) {
    const uint4 v = *reinterpret_cast<const uint4*>(digests);
    w[0] = v.x, w[1] = v.y, w[2] = v.z, w[3] = v.w;
  } else if constexpr (kBytes == 8) {
    const uint2 v = *reinterpret_cast<const uint2*>(digests);
    w[0] = v.x, w[1] = v.y;
  } else {
    w[0] = *reinterpret_cast<const uint32_t*>(digests);
  }
#else
#if defined(__SSE2__)
  if constexpr (kBytes == 16) {  // a host's byte compare (SerialTile, CpuPlatform::match16)
    const __m128i g = _mm_loadu_si128(reinterpret_cast<const __m128i*>(digests));
    const __m128i d = _mm_set1_epi8(static_cast<char>(digest));
    return static_cast<uint32_t>(_mm_movemask_epi8(_mm_cmpeq_epi8(g, d)));
  }
#endif
  std::memcpy(w, digests, kBytes);
#endif
  uint32_t mask = 0;
#pragma unroll
  for (int k = 0; k < kBytes / 4; ++k) mask |= match4(w[k], digest) << (4 * k);
  return mask;
}

/// Copies the 16 bytes at src to dst by the widest moves both addresses allow: on a
/// device one 16-byte vector load and store where both are 16-byte aligned (a table's
/// rows are), else 8-, 4- or 2-byte moves (a caller's row of odd width); on a host one
/// memcpy. Bytes, not values: a copy is bit for bit whatever the element type.
DYNEMB_HD DYNEMB_INLINE void move16(const void* src, void* dst) {
#if defined(__CUDA_ARCH__)
  const auto a = reinterpret_cast<uintptr_t>(src) | reinterpret_cast<uintptr_t>(dst);
  if ((a & 15) == 0) {
    *static_cast<uint4*>(dst) = *static_cast<const uint4*>(src);
  } else if ((a & 7) == 0) {
#pragma unroll
    for (int k = 0; k < 2; ++k) static_cast<uint2*>(dst)[k] = static_cast<const uint2*>(src)[k];
  } else if ((a & 3) == 0) {
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      static_cast<uint32_t*>(dst)[k] = static_cast<const uint32_t*>(src)[k];
    }
  } else {
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      static_cast<uint16_t*>(dst)[k] = static_cast<const uint16_t*>(src)[k];
    }
  }
#else
  std::memcpy(dst, src, 16);
#endif
}

}  // namespace dynemb

namespace dynemb {

/// Index of the lowest set bit of a non-zero mask.
DYNEMB_HD DYNEMB_INLINE int lowest_bit(uint32_t mask) {
#if defined(__CUDA_ARCH__)
  return __ffs(static_cast<int>(mask)) - 1;
#else
  return __builtin_ctz(mask);
#endif
}

/// Set bits of a mask.
DYNEMB_HD DYNEMB_INLINE int popcount32(uint32_t mask) {
#if defined(__CUDA_ARCH__)
  return __popc(mask);
#else
  return __builtin_popcount(mask);
#endif
}

}  // namespace dynemb
