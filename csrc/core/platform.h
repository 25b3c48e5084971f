// dynemb core: what the algorithm needs from a device (the Platform concept).
//
// The algorithm in table_ops.h is templated on a Platform type and calls only the
// static functions below; everything else it does is plain arithmetic. Two
// platforms exist: CpuPlatform (csrc/cpu/cpu_platform.h, std::atomic_ref, SSE2) and
// CudaPlatform (csrc/cuda/cuda_platform.cuh, atomicCAS, scalar lanes).
//
//   struct Platform {
//     // Spin until the bucket lock word is taken by this thread (0 -> 1).
//     static void lock(uint32_t* word);
//     // Release a lock taken with lock() (store 0 with release order).
//     static void unlock(uint32_t* word);
//     // Bit j set when group[j] == digest, for the 16 bytes at group.
//     static uint32_t match16(const uint8_t* group, uint8_t digest);
//     // Hint that addr will be read soon (no-op where there is no such hint).
//     static void prefetch(const void* addr);
//     // 32-bit atomics of the batch de-duplication set (core/dedup.h). Memory order:
//     // load32 ACQUIRE and store32 RELEASE (a thread that reads kReadyCell from load32
//     // must then see the key the claiming thread wrote before its store32: a relaxed
//     // load32 is a data race on the cell's key, as ThreadSanitizer showed on the CUDA
//     // platform); cas32 acquire-release; fetch_add32 may be relaxed.
//     static int32_t load32(int32_t*); static void store32(int32_t*, int32_t);
//     static int32_t cas32(int32_t*, int32_t expected, int32_t desired);  // returns old
//     static int32_t fetch_add32(int32_t*, int32_t);
//   };
//
// Locks are per bucket. A batch op that changes the table holds the lock of the
// bucket it changes while it scans, decides and writes, so two keys of one
// bucket never interleave. Read-only ops take no lock: the Python owner of a
// table never runs them beside a writer (see dynemb/table/rw_lock.py).
#pragma once

#include "core/macros.h"

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

}  // namespace dynemb
