// dynemb emulated CUDA executor: a host stand-in for the CUDA runtime, so that the
// csrc/cuda sources build with the host compiler and run on CPU threads.
//
// Kernels run on a small pool of OS threads (launch.cpp): each takes blocks from a
// shared counter, so keys of one batch really race between OS threads, as blocks do
// on a GPU. Within a block the threads run in lockstep (lockstep.h): each on a fiber,
// meeting at every warp collective and block barrier, in a drawn order between them.
// Supported: 1-D grids, global memory atomics, fences, memset, the warp collectives
// (__syncwarp, __shfl*_sync, __ballot_sync, __any/__all_sync, __match_*_sync,
// __reduce_*_sync, __activemask), __syncthreads, static __shared__ memory, and the
// cooperative-groups tiles of a block (cooperative_groups::tiled_partition<N>). Not
// supported: dynamic (extern) shared memory, grid-wide sync. Launches are synchronous:
// a launch returns when its grid has run, which keeps the stream order of the real
// device.
//
// No stronger than CUDA: the atomics are relaxed, as CUDA's atomicAdd, atomicCAS, ...
// are, and under ThreadSanitizer only what orders memory on a GPU orders it here
// (memory_model.h: fences, __syncwarp, __syncthreads, the launch), so a missing fence
// or __syncwarp is reported. An atomic or a vector load (core match_chunk) of a
// misaligned address fails the launch, as cudaErrorMisalignedAddress does on a GPU.
// What emulation cannot show: the hardware's own reorderings (x86 keeps stores in
// order), warp scheduling, speed.
#pragma once

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <functional>
#include <source_location>
#include <type_traits>

#include "cuda/launch_check.h"
#include "emulated/lockstep.h"
#include "emulated/memory_model.h"

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
// A hint to nvcc's register allocation (threads per block, blocks per SM): nothing to
// the host compiler.
#define __launch_bounds__(...)
// A block runs on one OS thread (its threads are that thread's fibers): a static
// thread_local is the block's shared memory. Like CUDA's, it starts undefined.
#define __shared__ static thread_local

/// A 1-D stand-in for CUDA's dim3 (the y and z extents are always 1 here).
struct dim3 {
  unsigned x, y, z;
  dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};

extern thread_local dim3 blockIdx;
extern thread_local dim3 threadIdx;
extern thread_local dim3 blockDim;
extern thread_local dim3 gridDim;

struct CUstream_st;
using cudaStream_t = CUstream_st*;
enum cudaError_t { cudaSuccess = 0 };

/// The storage types of float16 / bfloat16 rows: torch's, bit-identical to CUDA's.
using __half = c10::Half;
using __nv_bfloat16 = c10::BFloat16;

namespace dynemb::emulation {
void count_memset();  // launch.cpp: counters()
}
inline cudaError_t cudaMemsetAsync(void* p, int value, size_t bytes, cudaStream_t) {
  dynemb::emulation::count_memset();
  std::memset(p, value, bytes);
  return cudaSuccess;
}

namespace dynemb::emulation {

/// Fails the launch like a GPU's misaligned access (lane_fault) when `p` is not a
/// multiple of `bytes`. `access` names it ("a vector load").
void misaligned(const void* p, unsigned bytes, const char* access, std::source_location where);
inline void check_aligned(const void* p, unsigned bytes, const char* access,
                          std::source_location where = std::source_location::current()) {
  if (reinterpret_cast<uintptr_t>(p) % bytes != 0) misaligned(p, bytes, access, where);
}

/// The atomic at `p`, which must be aligned to its size (CUDA's atomics fault otherwise).
template <class T>
std::atomic_ref<T> atomic_at(T* p, std::source_location where) {
  check_aligned(p, sizeof(T), "an atomic", where);
  return std::atomic_ref<T>(*p);
}

/// atomicMax / atomicMin: replaces *p by v while `better(v, *p)`; returns the old value.
template <class T, class Better>
T atomic_extreme(T* p, T v, Better better, std::source_location where) {
  std::atomic_ref<T> a = atomic_at(p, where);
  T old = a.load(std::memory_order_relaxed);
  while (better(v, old)) {
    memory::before_atomic_write(p);
    if (a.compare_exchange_weak(old, v, std::memory_order_relaxed)) break;
  }
  memory::after_atomic_read(p);
  return old;
}

}  // namespace dynemb::emulation

// CUDA's atomics: relaxed (ordered by fences only, memory_model.h). Each tells the
// memory model (under ThreadSanitizer) that it reads *p and, before it, that it writes.
template <class T>
T atomicAdd(T* p, T v, std::source_location w = std::source_location::current()) {
  std::atomic_ref<T> a = dynemb::emulation::atomic_at(p, w);
  dynemb::emulation::memory::before_atomic_write(p);
  const T old = a.fetch_add(v, std::memory_order_relaxed);
  dynemb::emulation::memory::after_atomic_read(p);
  return old;
}
template <class T>
T atomicCAS(T* p, T expected, T desired, std::source_location w = std::source_location::current()) {
  std::atomic_ref<T> a = dynemb::emulation::atomic_at(p, w);
  if constexpr (dynemb::emulation::memory::kTracked) {
    // Only a write releases: a CAS that a relaxed load shows would fail writes nothing
    // (a spinning lock waiter's CAS must not publish the waiter's state).
    const T seen = a.load(std::memory_order_relaxed);
    dynemb::emulation::memory::after_atomic_read(p);
    if (seen != expected) return seen;
    dynemb::emulation::memory::before_atomic_write(p);
  }
  a.compare_exchange_strong(expected, desired, std::memory_order_relaxed);
  dynemb::emulation::memory::after_atomic_read(p);
  return expected;
}
template <class T>
T atomicExch(T* p, T v, std::source_location w = std::source_location::current()) {
  std::atomic_ref<T> a = dynemb::emulation::atomic_at(p, w);
  dynemb::emulation::memory::before_atomic_write(p);
  const T old = a.exchange(v, std::memory_order_relaxed);
  dynemb::emulation::memory::after_atomic_read(p);
  return old;
}
template <class T>
T atomicMax(T* p, T v, std::source_location w = std::source_location::current()) {
  return dynemb::emulation::atomic_extreme(p, v, [](T a, T b) { return b < a; }, w);
}
template <class T>
T atomicMin(T* p, T v, std::source_location w = std::source_location::current()) {
  return dynemb::emulation::atomic_extreme(p, v, [](T a, T b) { return a < b; }, w);
}
/// A device-scope fence: orders this thread's accesses before it with those after it,
/// for any thread that observes them through atomics and fences (memory_model.h).
inline void __threadfence() {
  std::atomic_thread_fence(std::memory_order_seq_cst);
  dynemb::emulation::memory::thread_fence();
}
/// cuda/runtime.cuh's load_acquire32 (cuda::atomic_ref's acquire load on a device).
inline int32_t load_acquire32(int32_t* p) {
  return std::atomic_ref<int32_t>(*p).load(std::memory_order_acquire);
}

namespace dynemb::emulation {

/// A collective's value as bits (types of at most 8 bytes, as CUDA's shuffles take).
template <class T>
uint64_t to_bits(T v) {
  static_assert(std::is_trivially_copyable_v<T> && sizeof(T) <= 8, "at most 8-byte values");
  uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof(T));
  return bits;
}
template <class T>
T from_bits(uint64_t bits) {
  T v;
  std::memcpy(&v, &bits, sizeof(T));
  return v;
}
template <class T>
T shuffle(Collective kind, unsigned mask, T v, int arg, int width, std::source_location where) {
  return from_bits<T>(warp_collective({kind, mask, to_bits(v), arg, width}, where));
}

}  // namespace dynemb::emulation

using std::source_location;

inline void __syncthreads(source_location w = source_location::current()) {
  dynemb::emulation::block_barrier(w);
}
inline void __syncwarp(unsigned mask = 0xffffffffu, source_location w = source_location::current()) {
  dynemb::emulation::warp_collective({dynemb::emulation::Collective::kSyncWarp, mask, 0}, w);
}
inline unsigned __activemask() { return dynemb::emulation::active_lanes(); }
template <class T>
T __shfl_sync(unsigned mask, T v, int src, int width = 32, source_location w = source_location::current()) {
  return dynemb::emulation::shuffle(dynemb::emulation::Collective::kShflIdx, mask, v, src, width, w);
}
template <class T>
T __shfl_up_sync(unsigned mask, T v, unsigned delta, int width = 32,
                 source_location w = source_location::current()) {
  return dynemb::emulation::shuffle(dynemb::emulation::Collective::kShflUp, mask, v,
                                    static_cast<int>(delta), width, w);
}
template <class T>
T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = 32,
                   source_location w = source_location::current()) {
  return dynemb::emulation::shuffle(dynemb::emulation::Collective::kShflDown, mask, v,
                                    static_cast<int>(delta), width, w);
}
template <class T>
T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32,
                  source_location w = source_location::current()) {
  return dynemb::emulation::shuffle(dynemb::emulation::Collective::kShflXor, mask, v, lane_mask, width, w);
}
inline unsigned __ballot_sync(unsigned mask, int pred, source_location w = source_location::current()) {
  return static_cast<unsigned>(dynemb::emulation::warp_collective(
      {dynemb::emulation::Collective::kBallot, mask, pred != 0}, w));
}
inline int __any_sync(unsigned mask, int pred, source_location w = source_location::current()) {
  return static_cast<int>(
      dynemb::emulation::warp_collective({dynemb::emulation::Collective::kAny, mask, pred != 0}, w));
}
inline int __all_sync(unsigned mask, int pred, source_location w = source_location::current()) {
  return static_cast<int>(
      dynemb::emulation::warp_collective({dynemb::emulation::Collective::kAll, mask, pred != 0}, w));
}
template <class T>
unsigned __match_any_sync(unsigned mask, T v, source_location w = source_location::current()) {
  return static_cast<unsigned>(dynemb::emulation::warp_collective(
      {dynemb::emulation::Collective::kMatchAny, mask, dynemb::emulation::to_bits(v)}, w));
}
template <class T>
unsigned __match_all_sync(unsigned mask, T v, int* pred, source_location w = source_location::current()) {
  const uint64_t r = dynemb::emulation::warp_collective(
      {dynemb::emulation::Collective::kMatchAll, mask, dynemb::emulation::to_bits(v)}, w);
  *pred = static_cast<int>(r >> 32);
  return static_cast<unsigned>(r);
}
#define DYNEMB_SHIM_REDUCE(name, type, kind)                                                      \
  inline type name(unsigned mask, type v, source_location w = source_location::current()) {      \
    return static_cast<type>(dynemb::emulation::warp_collective(                                  \
        {dynemb::emulation::Collective::kind, mask, static_cast<uint32_t>(v)}, w));               \
  }
DYNEMB_SHIM_REDUCE(__reduce_add_sync, unsigned, kReduceAdd)
DYNEMB_SHIM_REDUCE(__reduce_add_sync, int, kReduceAdd)
DYNEMB_SHIM_REDUCE(__reduce_min_sync, unsigned, kReduceMinUnsigned)
DYNEMB_SHIM_REDUCE(__reduce_min_sync, int, kReduceMinSigned)
DYNEMB_SHIM_REDUCE(__reduce_max_sync, unsigned, kReduceMaxUnsigned)
DYNEMB_SHIM_REDUCE(__reduce_max_sync, int, kReduceMaxSigned)
DYNEMB_SHIM_REDUCE(__reduce_and_sync, unsigned, kReduceAnd)
DYNEMB_SHIM_REDUCE(__reduce_or_sync, unsigned, kReduceOr)
DYNEMB_SHIM_REDUCE(__reduce_xor_sync, unsigned, kReduceXor)
#undef DYNEMB_SHIM_REDUCE

/// The cooperative-groups subset the kernels may use: a block, and its static tiles of
/// N = 1, 2, 4, 8, 16 or 32 threads (each a slice of a warp).
namespace cooperative_groups {

struct thread_block {
  void sync() const { __syncthreads(); }
  unsigned thread_rank() const { return threadIdx.x; }
  unsigned size() const { return blockDim.x; }
};
inline thread_block this_thread_block() { return {}; }

template <unsigned N>
struct thread_block_tile {
  static_assert(N >= 1 && N <= 32 && (N & (N - 1)) == 0, "tiles of 1, 2, 4, ..., 32 threads");
  static constexpr unsigned kMask = N == 32 ? 0xffffffffu : ((1u << N) - 1u);
  unsigned lane_base() const { return threadIdx.x % 32 / N * N; }
  unsigned mask() const { return kMask << lane_base(); }
  static constexpr unsigned size() { return N; }
  static constexpr unsigned num_threads() { return N; }
  unsigned thread_rank() const { return threadIdx.x % N; }
  unsigned meta_group_rank() const { return threadIdx.x / N; }
  unsigned meta_group_size() const { return (blockDim.x + N - 1) / N; }
  void sync(source_location w = source_location::current()) const { __syncwarp(mask(), w); }
  template <class T>
  T shfl(T v, int src, source_location w = source_location::current()) const {
    return __shfl_sync(mask(), v, src, static_cast<int>(N), w);
  }
  template <class T>
  T shfl_up(T v, unsigned d, source_location w = source_location::current()) const {
    return __shfl_up_sync(mask(), v, d, static_cast<int>(N), w);
  }
  template <class T>
  T shfl_down(T v, unsigned d, source_location w = source_location::current()) const {
    return __shfl_down_sync(mask(), v, d, static_cast<int>(N), w);
  }
  template <class T>
  T shfl_xor(T v, int m, source_location w = source_location::current()) const {
    return __shfl_xor_sync(mask(), v, m, static_cast<int>(N), w);
  }
  /// Bit k: the tile's thread k voted (CUDA's tiles number their own lanes).
  unsigned ballot(int pred, source_location w = source_location::current()) const {
    return (__ballot_sync(mask(), pred, w) >> lane_base()) & kMask;
  }
  int any(int pred, source_location w = source_location::current()) const {
    return __any_sync(mask(), pred, w);
  }
  int all(int pred, source_location w = source_location::current()) const {
    return __all_sync(mask(), pred, w);
  }
  template <class T>
  unsigned match_any(T v, source_location w = source_location::current()) const {
    return (__match_any_sync(mask(), v, w) >> lane_base()) & kMask;
  }
};

template <unsigned N>
thread_block_tile<N> tiled_partition(const thread_block&) {
  return {};
}

}  // namespace cooperative_groups

namespace dynemb::emulation {

/// Runs thread(t) for every thread t of a grid of grid x block threads: blocks on a
/// pool of OS threads, each block's threads in lockstep (lockstep.h), blockIdx /
/// threadIdx set for each. Returns when all ran; rethrows the first block's error
/// (a collective or barrier that cannot complete), naming `kernel`.
void run_grid(unsigned grid, unsigned block, const char* kernel, const std::function<void()>& thread);

/// In spin loops: lets the block's other threads run (the lock holder may be one of
/// them, stopped at a collective) and yields the OS thread.
void spin_pause();

/// The seed of the lane orders (DYNEMB_EMULATION_SEED, or drawn at start-up).
uint64_t lane_order_seed();

/// What the executor did since the process started: kernel launches, cudaMemsetAsync
/// calls, blocks and threads run (what a GPU would launch for the same ops), and the
/// device-to-host reads of the ops (each a wait for the stream on a GPU).
struct Counters {
  uint64_t launches, memsets, blocks, threads, host_reads;
};
Counters counters();
void count_host_read();  // launch.cpp: counters()

/// DYNEMB_LAUNCH(grid, block, stream, kernel)(args...) in emulation.
/// DYNEMB_EMULATION_FAULT_KERNEL=<text>: launches of kernels whose source text contains
/// it fail as a kernel that faulted on a GPU would (tests of the launch errors' path).
bool injected_fault(const char* kernel);  // launch.cpp

/// One checked launch (cuda/launch_check.h), run as on a GPU with
/// DYNEMB_CUDA_SYNC_LAUNCHES=1: a launch returns when its grid has run, and an error
/// raised inside a kernel names it.
struct Launch {
  uint64_t grid;
  uint64_t block;
  cudaStream_t stream;
  const char* name;
  template <class Kernel>
  auto of(Kernel* kernel) const {
    return [kernel, l = *this](auto... args) {
      if (!check_launch_shape(l.name, l.grid, l.block)) return;
      if (injected_fault(l.name)) {
        throw_launch_error(l.name, "an illegal memory access was encountered (injected)", true);
      }
      try {
        run_grid(static_cast<unsigned>(l.grid), static_cast<unsigned>(l.block), l.name,
                 [&] { kernel(args...); });
      } catch (const std::exception& e) {
        throw_launch_error(l.name, e.what(), true);
      }
    };
  }
};

}  // namespace dynemb::emulation
