// Litmus kernels of the emulated executor's memory model (csrc/emulated/memory_model.h),
// built with ThreadSanitizer: each case is a pattern whose outcome CUDA's memory model
// decides, racy (TSan must report a data race) or ordered (TSan must stay silent).
// Built and run by tests/csrc/test_emulated_memory_model.py (and `make sanitize-tsan`):
//   litmus_kernels CASE   runs one case; prints "ok" and exits 0 when TSan reports
//                         nothing (with halt_on_error, a report ends it with TSan's
//                         exit code)
//   litmus_kernels list   the cases
#define DYNEMB_CUDA_EMULATION 1

#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "cuda/cuda_platform.cuh"
#include "cuda/runtime.cuh"

namespace cg = cooperative_groups;

namespace {

// ---------------------------------------------------------------- publication
// Thread 0 of block 0 writes `data`, then sets `flag`; thread 0 of block 1 waits for
// the flag, then reads `data`. The two blocks first wait for each other, so that they
// run at the same time, on two OS threads of the pool (blocks that one OS thread runs
// in turn are ordered, memory_model.h).
enum class Publish { kPlain, kFences, kWriterFenceOnly, kAcquireLoad };

__device__ void meet(int* arrived) {
  atomicAdd(arrived, 1);
  while (atomicAdd(arrived, 0) < 2) DYNEMB_SPIN_PAUSE();
}

__global__ void publish_kernel(Publish how, int* arrived, int* data, int* flag, int* out) {
  if (threadIdx.x != 0) return;
  meet(arrived);
  if (blockIdx.x == 0) {
    *data = 42;
    if (how != Publish::kPlain) __threadfence();
    atomicExch(flag, 1);
  } else {
    if (how == Publish::kAcquireLoad) {
      while (load_acquire32(flag) == 0) DYNEMB_SPIN_PAUSE();
    } else {
      while (atomicAdd(flag, 0) == 0) DYNEMB_SPIN_PAUSE();
      if (how == Publish::kFences) __threadfence();
    }
    *out = *data;
  }
}

void publish(Publish how) {
  int arrived = 0, data = 0, flag = 0, out = 0;
  DYNEMB_LAUNCH(2, 32, nullptr, publish_kernel)(how, &arrived, &data, &flag, &out);
  std::printf("read %d\n", out);
}

// ---------------------------------------------------------------- a lock
// Two blocks of 32 threads add 1 to a counter under a spin lock (atomicCAS to take it,
// atomicExch to give it back): with CudaPlatform's fences after taking and before
// giving back, ordered; without, the atomics are relaxed and the counter races.
__global__ void lock_kernel(bool fenced, uint32_t* lock, int* count) {
  while (atomicCAS(lock, 0u, 1u) != 0u) DYNEMB_SPIN_PAUSE();
  if (fenced) __threadfence();
  *count += 1;
  if (fenced) __threadfence();
  atomicExch(lock, 0u);
}

void lock(bool fenced) {
  uint32_t word = 0;
  int count = 0;
  DYNEMB_LAUNCH(2, 32, nullptr, lock_kernel)(fenced, &word, &count);
  std::printf("counted %d\n", count);
}

// ---------------------------------------------------------------- shared memory
// Each thread writes its __shared__ slot, then reads another thread's after `how`.
enum class Meet { kNothing, kSyncWarp, kTileSync, kBallot, kShuffle, kSyncThreads };

__global__ void neighbour_kernel(Meet how, unsigned distance, int* out) {
  __shared__ int slots[64];
  const unsigned t = threadIdx.x;
  slots[t] = static_cast<int>(t) + 1;
  int vote = 0;
  switch (how) {
    case Meet::kNothing: break;
    case Meet::kSyncWarp: __syncwarp(); break;
    case Meet::kTileSync: cg::tiled_partition<8>(cg::this_thread_block()).sync(); break;
    case Meet::kBallot: vote = static_cast<int>(__ballot_sync(0xffffffffu, 1) & 1u); break;
    case Meet::kShuffle: vote = __shfl_sync(0xffffffffu, 1, 0); break;
    case Meet::kSyncThreads: __syncthreads(); break;
  }
  out[t] = slots[(t + distance) % blockDim.x] + vote;
}

/// `block` threads; each reads the slot `distance` threads on.
void neighbours(Meet how, unsigned block, unsigned distance) {
  std::vector<int> out(block);
  DYNEMB_LAUNCH(1, block, nullptr, neighbour_kernel)(how, distance, out.data());
  std::printf("read %d\n", out[0]);
}

}  // namespace

int main(int argc, char** argv) {
  // The expectation of each case is the test's (tests/csrc/test_emulated_memory_model.py).
  const std::map<std::string, void (*)()> cases = {
      // a flag published with no fence, a fence on the writer's side only, fences on
      // both sides, a fence then an acquire load
      {"publish_plain", [] { publish(Publish::kPlain); }},
      {"publish_writer_fence_only", [] { publish(Publish::kWriterFenceOnly); }},
      {"publish_fences", [] { publish(Publish::kFences); }},
      {"publish_acquire_load", [] { publish(Publish::kAcquireLoad); }},
      {"lock_unfenced", [] { lock(false); }},
      {"lock_fenced", [] { lock(true); }},
      // a lane of a warp reads its neighbour's slot (within a tile of 8 for tile.sync())
      {"shared_nothing", [] { neighbours(Meet::kNothing, 32, 1); }},
      {"shared_ballot", [] { neighbours(Meet::kBallot, 32, 1); }},
      {"shared_shuffle", [] { neighbours(Meet::kShuffle, 32, 1); }},
      {"shared_syncwarp", [] { neighbours(Meet::kSyncWarp, 32, 1); }},
      {"shared_tile_sync", [] { neighbours(Meet::kTileSync, 8, 1); }},
      // a thread reads a slot of the other warp of its block
      {"shared_other_warp_syncwarp", [] { neighbours(Meet::kSyncWarp, 64, 32); }},
      {"shared_other_warp_syncthreads", [] { neighbours(Meet::kSyncThreads, 64, 32); }},
  };
  if (argc == 2 && std::string(argv[1]) == "list") {
    for (const auto& [name, run] : cases) std::printf("%s\n", name.c_str());
    return 0;
  }
  if (argc != 2 || cases.count(argv[1]) == 0) {
    std::fprintf(stderr, "usage: litmus_kernels CASE | list\n");
    return 2;
  }
  cases.at(argv[1])();
  std::printf("ok\n");
  return 0;
}
