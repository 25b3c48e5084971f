// dynemb core: compiler portability macros.
//
// Everything under csrc/core is header-only, free of torch and of any device
// runtime, and compiles both as host C++ and as CUDA device code. DYNEMB_HD marks
// a function callable from both; it expands to nothing for the host compiler.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define DYNEMB_HD __host__ __device__
#define DYNEMB_INLINE __forceinline__
#define DYNEMB_INLINE_LAMBDA
#else
#define DYNEMB_HD
#define DYNEMB_INLINE inline __attribute__((always_inline))
// A lambda called in a hot loop: gcc may leave a lambda out of line (a call per
// element, no vectorization) unless told.
#define DYNEMB_INLINE_LAMBDA __attribute__((always_inline))
#endif

namespace dynemb {

/// Status of one key after a batch upsert. The numeric values are part of the
/// op contract (dynemb/_ops.py mirrors them).
enum class Status : int8_t {
  kHit = 0,       ///< the key was already stored
  kInserted = 1,  ///< stored in a free slot
  kEvicted = 2,   ///< stored in place of an evicted resident
  kFailed = 3,    ///< not stored (bucket full under NO_EVICTION, or refused score)
};

/// Number of Status values (per-status count arrays), and their names by code.
constexpr int kStatusCount = static_cast<int>(Status::kFailed) + 1;
constexpr const char* kStatusNames[kStatusCount] = {"HIT", "INSERTED", "EVICTED", "FAILED"};

}  // namespace dynemb
