// dynemb CUDA executor: the Platform of core/platform.h for device threads.
// Torch-free. Spin locks rely on independent thread scheduling (sm_70+).
#pragma once

#include "core/platform.h"

namespace dynemb {

struct CudaPlatform {
  DYNEMB_HD static void lock(uint32_t* word) {
#if defined(__CUDA_ARCH__)
    while (atomicCAS(word, 0u, 1u) != 0u) {
    }
    __threadfence();
#else
    (void)word;
#endif
  }

  DYNEMB_HD static void unlock(uint32_t* word) {
#if defined(__CUDA_ARCH__)
    __threadfence();
    atomicExch(word, 0u);
#else
    (void)word;
#endif
  }

  DYNEMB_HD static uint32_t match16(const uint8_t* group, uint8_t digest) {
    return match16_scalar(group, digest);
  }

  DYNEMB_HD static void prefetch(const void*) {}
};

}  // namespace dynemb
