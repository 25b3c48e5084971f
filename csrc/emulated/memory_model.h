// dynemb emulated CUDA executor: the happens-before that ThreadSanitizer is told, so that
// a kernel that is racy on a GPU is racy under TSan too (`make sanitize-tsan`).
//
// Every lane of an emulated block is a TSan thread of its own (its fiber, fiber.h), and
// switching between lanes tells TSan nothing (__tsan_switch_to_fiber_no_sync): two lanes
// are ordered only by what CUDA orders them by. The edges, each an annotation
// (__tsan_release on a sync object, __tsan_acquire of it), are:
//
//   launch      everything before a launch happens before each of its threads, and each
//               thread before whatever follows the launch on the host (stream order).
//   __syncwarp(mask), tile.sync()   the lanes of the mask: each arrival happens before
//               each departure. tile.sync() is __syncwarp over the tile's mask, as
//               cooperative groups implement it.
//   __syncthreads(), block.sync()   the same over the whole block.
//   __threadfence()   PTX's fence patterns, per address: a fence followed (later in the
//               lane) by an atomic write to M is a release on M, an atomic read of M
//               followed by a fence is an acquire of M; so a flag stored after a fence
//               and read before a fence publishes what was written before the first.
//   acquire / release atomics (load_acquire32, std::atomic_ref orders)   TSan's own.
//   blocks of one OS thread   the pool runs each block on one OS thread, one after
//               another; a block's threads happen before those of the next block that
//               OS thread runs (its __shared__ memory and stacks are reused).
//
// Nothing else orders memory. The shim's atomics (atomicAdd, atomicCAS, atomicExch,
// atomicMax, atomicMin) are relaxed, as CUDA's are. The other warp collectives
// (__shfl*_sync, __ballot_sync, __any/__all_sync, __match_*_sync, __reduce_*_sync,
// __activemask) exchange register values only: the CUDA C++ Programming Guide states
// memory ordering for __syncwarp ("guarantees memory ordering among threads
// participating in the barrier") and for none of them (of the vote and match
// functions it says they "do not imply a memory barrier"), so a lane that reads
// another lane's write after a ballot without a __syncwarp is reported.
//
// Limits (each makes TSan miss a race, never report a false one):
//   - a release pattern publishes the lane's state at its atomic write, not at its
//     fence (writes between the two look published); an acquire pattern takes M's
//     state at the fence, not at the read (releases to M the read did not observe are
//     taken too); a release sequence is never broken (TSan joins every release to M);
//   - blocks that one OS thread runs in turn are ordered: a race between two blocks is
//     found when the pool runs them on different OS threads (it has at least four);
//   - TSan sees the accesses of the lane order drawn for the run (DYNEMB_EMULATION_SEED)
//     and remembers a bounded history; it keeps clocks for 256 threads at a time, and
//     with more lanes alive (blocks of 256 threads on several OS threads) a lane that
//     takes over another's clock slot is ordered after that slot's earlier users.
// Without ThreadSanitizer (the Python extension) everything here compiles to nothing.
#pragma once

#include <vector>

#if defined(__SANITIZE_THREAD__)
#define DYNEMB_EMULATION_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define DYNEMB_EMULATION_TSAN 1
#endif
#endif

#if defined(DYNEMB_EMULATION_TSAN)
#include <sanitizer/tsan_interface.h>
extern "C" void __tsan_ignore_thread_begin();
extern "C" void __tsan_ignore_thread_end();
#endif

namespace dynemb::emulation::memory {

#if defined(DYNEMB_EMULATION_TSAN)
inline constexpr bool kTracked = true;
inline void release(const void* sync) { __tsan_release(const_cast<void*>(sync)); }
inline void acquire(const void* sync) { __tsan_acquire(const_cast<void*>(sync)); }
inline void ignore_begin() { __tsan_ignore_thread_begin(); }
inline void ignore_end() { __tsan_ignore_thread_end(); }
#else
inline constexpr bool kTracked = false;
inline void release(const void*) {}
inline void acquire(const void*) {}
inline void ignore_begin() {}
inline void ignore_end() {}
#endif

/// While alive, TSan ignores the calling thread's memory accesses: the runtime's
/// bookkeeping, which a lane and its OS thread's scheduler share without happens-before
/// (the lane's state, its collective's value, the block indices). Sync annotations
/// still count.
class RuntimeScope {
 public:
  RuntimeScope() { ignore_begin(); }
  ~RuntimeScope() { ignore_end(); }
  RuntimeScope(const RuntimeScope&) = delete;
  RuntimeScope& operator=(const RuntimeScope&) = delete;
};

/// What a lane's fences need (TSan builds): whether it has fenced (its atomic writes
/// are releases from then on) and the addresses its atomics read since its last fence
/// (the next fence acquires them).
struct LaneFences {
  bool fenced = false;
  std::vector<const void*> reads;
  void clear() {
    fenced = false;
    reads.clear();
  }
};

/// The running lane's LaneFences, or null outside a kernel (lockstep.cpp).
LaneFences* current_lane_fences();

void note_atomic_write(const void* p);
void note_atomic_read(const void* p);
void note_fence();

/// The shim's atomics call these around their access (no-ops without TSan).
inline void before_atomic_write(const void* p) {
  if constexpr (kTracked) note_atomic_write(p);
}
inline void after_atomic_read(const void* p) {
  if constexpr (kTracked) note_atomic_read(p);
}
inline void thread_fence() {
  if constexpr (kTracked) note_fence();
}

}  // namespace dynemb::emulation::memory
