// dynemb emulated CUDA executor: lockstep warps and blocks.
//
// Every thread of an emulated block runs on a fiber of the OS thread that runs the
// block. A thread runs until it reaches a warp collective (__syncwarp, __shfl*_sync,
// __ballot_sync, ...), a block barrier (__syncthreads) or its end; a collective
// completes when every lane its mask names has reached the same collective with the
// same mask, a barrier when every thread of the block has reached the same
// __syncthreads. Between those meeting points the threads run one after another in
// an order drawn per launch and block from a seed (DYNEMB_EMULATION_SEED, random when
// unset), so a kernel that relies on an unsynchronised lane order fails under some
// seed instead of passing by luck; every error message names the seed to replay it.
//
// What would hang on a GPU is an error here, naming the kernel, the block, the lanes
// and the call sites: a collective that a lane of its mask never reaches (the lane
// exited, or waits at another collective), a collective whose mask leaves out the
// calling lane, a __syncthreads that some thread of the block skips or reaches at
// another call site (a barrier in divergent code). A lane spinning on a lock
// (DYNEMB_SPIN_PAUSE) lets the block's other threads run, as independent thread
// scheduling does on a GPU.
//
// Semantics follow the CUDA C++ Programming Guide and PTX's shfl.sync; where CUDA
// leaves a result undefined (a shuffle from a lane outside the mask, a width that is
// not a power of two) the emulation refuses it. __activemask() returns the lanes of
// the warp that reach it together: it waits until no thread of the block can run,
// then hands each waiting lane the set of its warp's lanes waiting there.
//
// Under ThreadSanitizer each thread is a TSan thread of its own, ordered with the
// others only where CUDA orders them (memory_model.h): __syncwarp and __syncthreads
// order memory, the other collectives do not.
#pragma once

#include <cstdint>
#include <functional>
#include <source_location>
#include <string>

namespace dynemb::emulation {

enum class Collective : uint8_t {
  kSyncWarp,
  kShflIdx,
  kShflUp,
  kShflDown,
  kShflXor,
  kBallot,
  kAny,
  kAll,
  kMatchAny,
  kMatchAll,
  kReduceAdd,
  kReduceMinUnsigned,
  kReduceMaxUnsigned,
  kReduceMinSigned,
  kReduceMaxSigned,
  kReduceAnd,
  kReduceOr,
  kReduceXor,
};

/// The CUDA name of a collective, for messages ("__shfl_down_sync").
const char* collective_name(Collective kind);

/// What a lane passes to a collective: its mask, its value (any type of at most 8
/// bytes, as bits), the source lane or delta of a shuffle and the shuffle's width.
struct CollectiveCall {
  Collective kind;
  unsigned mask;
  uint64_t value;
  int arg = 0;
  int width = 32;
};

/// Called by the shim's intrinsics from a lane: returns this lane's result once every
/// lane of call.mask has made the same call (see the header comment for the rules).
uint64_t warp_collective(const CollectiveCall& call, std::source_location where);

/// __syncthreads(): returns once every thread of the block has reached this call site.
void block_barrier(std::source_location where);

/// __activemask(): the lanes of the calling warp that reach it together (see above).
unsigned active_lanes();

/// Inside a spin loop: lets the block's other threads (and other OS threads) run.
void lane_yield();

/// A fault of the calling thread, where a GPU traps (a misaligned access): the launch
/// throws std::runtime_error naming the kernel, the block and `what`; the block's other
/// threads stop where they are. Outside a kernel it throws at once.
[[noreturn]] void lane_fault(const std::string& what);

/// What the block runner needs of the launch it serves.
struct LaunchInfo {
  const char* kernel;  // the kernel expression of the launch, for messages
  uint64_t number;     // the launch's number in this process (part of the lane order)
  uint64_t seed;       // DYNEMB_EMULATION_SEED
};

/// Runs thread() for every thread of block `block_index` (blockIdx, threadIdx set),
/// as lockstep fibers on the calling OS thread. Throws std::runtime_error on a
/// collective or barrier error (see above); the block's other threads stop there.
void run_block(const LaunchInfo& launch, unsigned block_index, unsigned block_size,
               const std::function<void()>& thread);

}  // namespace dynemb::emulation
