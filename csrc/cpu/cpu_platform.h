// dynemb CPU executor: the Platform of core/platform.h for host threads.
#pragma once

#include <atomic>
#include <cstring>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif
#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "core/platform.h"

namespace dynemb {

struct CpuPlatform {
  static uint32_t match16(const uint8_t* group, uint8_t digest) {
    return match_chunk<16>(group, digest);  // SSE2's byte compare where there is one
  }

  // An asm statement, not __builtin_prefetch: GCC's pure/const analysis may delete a
  // whole helper whose only effects are builtin prefetches (it did, silently).
  static void prefetch(const void* addr) {
#if defined(__x86_64__)
    asm volatile("prefetcht0 %0" : : "m"(*static_cast<const char*>(addr)));
#else
    __builtin_prefetch(addr, 0, 3);
#endif
  }
  static void prefetch_for_write(const void* addr) {
#if defined(__x86_64__)
    asm volatile("prefetchw %0" : : "m"(*static_cast<const char*>(addr)));
#else
    __builtin_prefetch(addr, 1, 3);
#endif
  }

  // Every 64-byte line of [addr, addr + bytes): a row is several lines, and
  // prefetching the first alone leaves the others to demand misses.
  static void prefetch_lines(const void* addr, int64_t bytes) {
    for (int64_t off = 0; off < bytes; off += 64) prefetch(static_cast<const char*>(addr) + off);
  }
  static void prefetch_lines_for_write(const void* addr, int64_t bytes) {
    for (int64_t off = 0; off < bytes; off += 64) {
      prefetch_for_write(static_cast<const char*>(addr) + off);
    }
  }

  // Copies `bytes` (a multiple of 16) to a 16-byte aligned dst with non-temporal
  // stores (no read for ownership, no cache fill) where the CPU has them; they are
  // weakly ordered: store_fence() before another thread may read dst.
  static void stream_copy(void* dst, const void* src, int64_t bytes) {
#if defined(__AVX512F__)
    // Whole lines in one store each where they fit: a write-combining buffer is
    // then full at once and leaves, instead of stalling the next stores.
    if ((reinterpret_cast<uintptr_t>(dst) | static_cast<uintptr_t>(bytes)) % 64 == 0) {
      for (int64_t off = 0; off < bytes; off += 64) {
        const __m512i line = _mm512_loadu_si512(static_cast<const char*>(src) + off);
        _mm512_stream_si512(reinterpret_cast<__m512i*>(static_cast<char*>(dst) + off), line);
      }
      return;
    }
#endif
#if defined(__SSE2__)
    for (int64_t off = 0; off < bytes; off += 16) {
      const __m128i chunk =
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const char*>(src) + off));
      _mm_stream_si128(reinterpret_cast<__m128i*>(static_cast<char*>(dst) + off), chunk);
    }
#else
    std::memcpy(dst, src, static_cast<size_t>(bytes));
#endif
  }
  static void store_fence() {
#if defined(__SSE2__)
    _mm_sfence();
#endif
  }

  static int32_t load32(int32_t* p) {
    return std::atomic_ref<int32_t>(*p).load(std::memory_order_acquire);
  }
  static void store32(int32_t* p, int32_t v) {
    std::atomic_ref<int32_t>(*p).store(v, std::memory_order_release);
  }
  static int32_t cas32(int32_t* p, int32_t expected, int32_t desired) {
    std::atomic_ref<int32_t>(*p).compare_exchange_strong(expected, desired,
                                                         std::memory_order_acq_rel);
    return expected;
  }
  static int32_t fetch_add32(int32_t* p, int32_t v) {
    return std::atomic_ref<int32_t>(*p).fetch_add(v, std::memory_order_relaxed);
  }
};

}  // namespace dynemb
