// dynemb CUDA executor: the Platform of core/platform.h for device threads.
// Torch-free. The device branches also run in emulation (runtime.cuh), over the shim's atomics.
#pragma once

#include "core/platform.h"
#include "cuda/runtime.cuh"

namespace dynemb::DYNEMB_CUDA_NS {

struct CudaPlatform {
  /// One 16-byte load and four SWAR compares (core match_chunk), not 16 byte loads.
  DYNEMB_HD static uint32_t match16(const uint8_t* group, uint8_t digest) {
    DYNEMB_VECTOR_LOAD(group, 16);
    return match_chunk<16>(group, digest);
  }

  DYNEMB_HD static void prefetch(const void*) {}

#if DYNEMB_CUDA_DEVICE_CODE
  // Acquire (core/platform.h): a plain or relaxed read here let dedup_cell read a cell's key
  // before the claiming thread's write of it became visible (ThreadSanitizer found it).
  __device__ static int32_t load32(int32_t* p) { return load_acquire32(p); }
  __device__ static void store32(int32_t* p, int32_t v) {
    __threadfence();
    atomicExch(p, v);
  }
  __device__ static int32_t cas32(int32_t* p, int32_t expected, int32_t desired) {
    const int32_t old = atomicCAS(p, expected, desired);
    if (old != expected) DYNEMB_SPIN_PAUSE();  // a waiter spins on this
    return old;
  }
  __device__ static int32_t fetch_add32(int32_t* p, int32_t v) { return atomicAdd(p, v); }
#else
  static int32_t load32(int32_t* p) { return *p; }
  static void store32(int32_t* p, int32_t v) { *p = v; }
  static int32_t cas32(int32_t* p, int32_t expected, int32_t desired) {
    const int32_t old = *p;
    if (old == expected) *p = desired;
    return old;
  }
  static int32_t fetch_add32(int32_t* p, int32_t v) {
    const int32_t old = *p;
    *p += v;
    return old;
  }
#endif
};

}  // namespace dynemb::DYNEMB_CUDA_NS
