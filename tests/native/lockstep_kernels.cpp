// The emulated executor's lockstep warps and blocks (csrc/emulated/lockstep.h), one
// case per primitive, checked against CUDA's documented semantics (the CUDA C++
// Programming Guide's warp intrinsics, PTX shfl.sync), and the errors that replace a
// GPU's hang. Built and run by tests/csrc/test_emulated_lockstep.py:
//   lockstep_kernels CASE    prints "ok" and exits 0, or prints what differs and exits 1
//   lockstep_kernels order   prints the order in which a block's threads ran
#define DYNEMB_CUDA_EMULATION 1

#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "cuda/runtime.cuh"
#include "cuda/tile.cuh"
#include "lockstep_checks.h"

namespace cg = cooperative_groups;

namespace {

unsigned lane_id() { return threadIdx.x % 32; }

// PTX shfl.sync's source lane (the reference the emulation is checked against, written
// from the PTX ISA's pseudo-code independently of lockstep.cpp).
int ptx_source(char mode, unsigned lane, unsigned b, unsigned width) {
  const unsigned c = mode == 'u' ? (32 - width) << 8 : ((32 - width) << 8) | 0x1f;
  const unsigned segmask = (c >> 8) & 0x1f, cval = c & 0x1f;
  const int max_lane = static_cast<int>((lane & segmask) | (cval & ~segmask));
  const int min_lane = static_cast<int>(lane & segmask);
  int j = 0;
  bool pval = false;
  b &= 0x1f;
  switch (mode) {
    case 'u': j = static_cast<int>(lane) - static_cast<int>(b); pval = j >= max_lane; break;
    case 'd': j = static_cast<int>(lane + b); pval = j <= max_lane; break;
    case 'x': j = static_cast<int>(lane ^ b); pval = j <= max_lane; break;
    default: j = min_lane | static_cast<int>(b & ~segmask); pval = j <= max_lane; break;
  }
  return pval ? j : static_cast<int>(lane);
}

// ---------------------------------------------------------------- shuffles
__global__ void shuffle_kernel(char mode, int arg, int width, int64_t* out) {
  const unsigned lane = lane_id();
  const int64_t mine = int64_t{1} << 40 | (static_cast<int64_t>(blockIdx.x) << 8) | threadIdx.x;
  int64_t got = 0;
  const int src = mode == 'i' ? static_cast<int>(lane * 7 + static_cast<unsigned>(arg)) : arg;
  switch (mode) {
    case 'i': got = __shfl_sync(kFull, mine, src, width); break;
    case 'u': got = __shfl_up_sync(kFull, mine, static_cast<unsigned>(arg), width); break;
    case 'd': got = __shfl_down_sync(kFull, mine, static_cast<unsigned>(arg), width); break;
    default: got = __shfl_xor_sync(kFull, mine, arg, width); break;
  }
  out[blockIdx.x * blockDim.x + threadIdx.x] = got;
}

void shuffles() {
  const unsigned grid = 3, block = 64;
  for (char mode : {'i', 'u', 'd', 'x'}) {
    for (int width : {1, 2, 4, 8, 16, 32}) {
      for (int arg : {0, 1, 3, 5, 8, 13, 16, 31, 32, 33}) {
        std::vector<int64_t> out(grid * block), want(grid * block);
        DYNEMB_LAUNCH(grid, block, nullptr, shuffle_kernel)(mode, arg, width, out.data());
        for (unsigned b = 0; b < grid; ++b) {
          for (unsigned t = 0; t < block; ++t) {
            const unsigned lane = t % 32;
            const unsigned b_arg = mode == 'i' ? lane * 7 + static_cast<unsigned>(arg) : static_cast<unsigned>(arg);
            const unsigned src = t - lane + static_cast<unsigned>(ptx_source(mode, lane, b_arg, width));
            want[b * block + t] = int64_t{1} << 40 | (static_cast<int64_t>(b) << 8) | src;
          }
        }
        const std::string what = std::string("shuffle mode ") + mode + " width " + std::to_string(width) +
                                 " arg " + std::to_string(arg);
        expect_eq(out, want, what.c_str());
      }
    }
  }
}

__global__ void shuffle_types_kernel(double* d, float* f, uint16_t* h) {
  const unsigned lane = lane_id();
  d[threadIdx.x] = __shfl_xor_sync(kFull, 0.5 + lane, 1);
  f[threadIdx.x] = __shfl_down_sync(kFull, 0.25f * static_cast<float>(lane), 2);
  h[threadIdx.x] = __shfl_sync(kFull, static_cast<uint16_t>(1000 + lane), 31);
}

void shuffle_types() {
  std::vector<double> d(32);
  std::vector<float> f(32);
  std::vector<uint16_t> h(32);
  DYNEMB_LAUNCH(1, 32, nullptr, shuffle_types_kernel)(d.data(), f.data(), h.data());
  for (unsigned lane = 0; lane < 32; ++lane) {
    expect(d[lane] == 0.5 + (lane ^ 1), "__shfl_xor_sync of a double");
    expect(f[lane] == 0.25f * static_cast<float>(lane + 2 < 32 ? lane + 2 : lane), "__shfl_down_sync of a float");
    expect(h[lane] == 1031, "__shfl_sync of a 16-bit value");
  }
}

// ---------------------------------------------------------------- votes
__global__ void vote_kernel(unsigned* ballot, int* any, int* all) {
  const unsigned lane = lane_id();
  if (lane % 2 == 1) return;  // the odd lanes take no part: the mask leaves them out
  const unsigned evens = 0x55555555u;
  ballot[threadIdx.x] = __ballot_sync(evens, lane % 4 == 0);
  any[threadIdx.x] = __any_sync(evens, lane == 6);
  all[threadIdx.x] = __all_sync(evens, lane < 32) * 2 + __all_sync(evens, lane != 10);
}

void votes() {
  std::vector<unsigned> ballot(64, 7);
  std::vector<int> any(64, 7), all(64, 7);
  DYNEMB_LAUNCH(1, 64, nullptr, vote_kernel)(ballot.data(), any.data(), all.data());
  for (unsigned t = 0; t < 64; ++t) {
    const bool even = t % 2 == 0;
    expect(ballot[t] == (even ? 0x11111111u : 7u), "__ballot_sync over the even lanes");
    expect(any[t] == (even ? 1 : 7), "__any_sync over the even lanes");
    expect(all[t] == (even ? 2 : 7), "__all_sync over the even lanes");
  }
}

__global__ void match_reduce_kernel(unsigned* match, unsigned* match_all, int* pred, unsigned* sums,
                                    int* mins, unsigned* bits) {
  const unsigned lane = lane_id();
  const unsigned t = threadIdx.x;
  match[t] = __match_any_sync(kFull, static_cast<int64_t>(lane % 3) << 33);
  int p = -1;
  match_all[t] = __match_all_sync(kFull, lane < 32 ? 5 : 6, &p);
  pred[t] = p;
  sums[t] = __reduce_add_sync(kFull, lane + 1);
  mins[t] = __reduce_min_sync(kFull, static_cast<int>(lane) - 7) * 1000 +
            __reduce_max_sync(kFull, static_cast<int>(lane) - 7);
  bits[t] = __reduce_or_sync(kFull, 1u << lane) ^ __reduce_and_sync(kFull, lane | 0x100u) ^
            __reduce_xor_sync(kFull, lane) ^ __reduce_max_sync(kFull, lane) ^
            (__reduce_min_sync(kFull, lane + 4) << 12);
}

void match_and_reduce() {
  std::vector<unsigned> match(32), match_all(32), sums(32), bits(32);
  std::vector<int> pred(32), mins(32);
  DYNEMB_LAUNCH(1, 32, nullptr, match_reduce_kernel)(match.data(), match_all.data(), pred.data(),
                                                      sums.data(), mins.data(), bits.data());
  for (unsigned lane = 0; lane < 32; ++lane) {
    unsigned same = 0;
    for (unsigned o = 0; o < 32; ++o) same |= (o % 3 == lane % 3) ? 1u << o : 0u;
    expect(match[lane] == same, "__match_any_sync of 64-bit values");
    expect(match_all[lane] == kFull && pred[lane] == 1, "__match_all_sync of equal values");
    expect(sums[lane] == 528, "__reduce_add_sync");
    expect(mins[lane] == -7 * 1000 + 24, "__reduce_min_sync / __reduce_max_sync of signed values");
    expect(bits[lane] == (kFull ^ 0x100u ^ 0u ^ 31u ^ (4u << 12)), "__reduce_or/and/xor/max/min_sync");
  }
}

// ---------------------------------------------------------------- warp and block sync
// Each lane writes its slot, then reads its neighbour's: only a __syncwarp between the
// two makes the neighbour's write visible in every lane order.
// (stamp: a value per launch, since shared memory keeps what the last block left there)
__global__ void neighbour_kernel(bool synced, int stamp, int* out) {
  __shared__ int slots[64];
  const unsigned next = (threadIdx.x + 1) % 32 + threadIdx.x / 32 * 32;
  if (synced) {
    slots[threadIdx.x] = static_cast<int>(threadIdx.x) + stamp;
    __syncwarp();
    out[threadIdx.x] = slots[next];
  } else {  // atomics: a race of values, not a data race (ThreadSanitizer runs this)
    atomicExch(&slots[threadIdx.x], static_cast<int>(threadIdx.x) + stamp);
    out[threadIdx.x] = atomicAdd(&slots[next], 0);
  }
}

void syncwarp_orders() {
  std::vector<int> out(64);
  DYNEMB_LAUNCH(1, 64, nullptr, neighbour_kernel)(true, 100, out.data());
  for (unsigned t = 0; t < 64; ++t) {
    expect(out[t] == static_cast<int>((t + 1) % 32 + t / 32 * 32) + 100, "__syncwarp made a write visible");
  }
  // Without it, some lane reads its neighbour's slot before the neighbour wrote it.
  bool stale = false;
  for (int launch = 0; launch < 8 && !stale; ++launch) {
    std::vector<int> unsynced(64, 0);
    const int stamp = 1000 * (launch + 1);
    DYNEMB_LAUNCH(1, 64, nullptr, neighbour_kernel)(false, stamp, unsynced.data());
    for (unsigned t = 0; t < 64; ++t) stale |= unsynced[t] != static_cast<int>((t + 1) % 32 + t / 32 * 32) + stamp;
  }
  expect(stale, "8 launches without __syncwarp never ran a lane before its neighbour");
}

/// A block-wide tree sum in shared memory.
__global__ void block_sum_kernel(const int* in, int* out) {
  __shared__ int partial[256];
  partial[threadIdx.x] = in[blockIdx.x * blockDim.x + threadIdx.x];
  __syncthreads();
  for (unsigned half = blockDim.x / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) partial[threadIdx.x] += partial[threadIdx.x + half];
    __syncthreads();
  }
  if (threadIdx.x == 0) out[blockIdx.x] = partial[0];
}

void syncthreads_shared() {
  const unsigned grid = 8, block = 256;
  std::vector<int> in(grid * block), out(grid);
  std::vector<int> want(grid, 0);
  for (unsigned i = 0; i < in.size(); ++i) {
    in[i] = static_cast<int>(i * 37 % 101);
    want[i / block] += in[i];
  }
  DYNEMB_LAUNCH(grid, block, nullptr, block_sum_kernel)(in.data(), out.data());
  expect_eq(out, want, "a __syncthreads tree sum in __shared__ memory");
}

// ---------------------------------------------------------------- cooperative groups
__global__ void tile_kernel(unsigned* rank, unsigned* ballot, int* shfl, unsigned* meta) {
  cg::thread_block block = cg::this_thread_block();
  cg::thread_block_tile<8> tile = cg::tiled_partition<8>(block);
  const unsigned t = threadIdx.x;
  rank[t] = tile.thread_rank();
  ballot[t] = tile.ballot(tile.thread_rank() >= 5);
  shfl[t] = tile.shfl(static_cast<int>(t), 7) + tile.shfl_down(static_cast<int>(t), 1) * 1000;
  tile.sync();
  meta[t] = tile.meta_group_rank() * 100 + static_cast<unsigned>(tile.any(tile.thread_rank() == 3)) * 10 +
            static_cast<unsigned>(tile.all(tile.thread_rank() < 8));
  block.sync();
}

void tiles() {
  std::vector<unsigned> rank(64), ballot(64), meta(64);
  std::vector<int> shfl(64);
  DYNEMB_LAUNCH(1, 64, nullptr, tile_kernel)(rank.data(), ballot.data(), shfl.data(), meta.data());
  for (unsigned t = 0; t < 64; ++t) {
    const unsigned base = t / 8 * 8;
    expect(rank[t] == t % 8, "tile.thread_rank()");
    expect(ballot[t] == 0xe0u, "tile.ballot() numbers the tile's own threads");
    const unsigned down = t % 8 + 1 < 8 ? t + 1 : t;
    expect(shfl[t] == static_cast<int>(base + 7 + down * 1000), "tile.shfl / tile.shfl_down stay in the tile");
    expect(meta[t] == t / 8 * 100 + 11, "tile.meta_group_rank / any / all");
  }
}

// The lanes that reach __activemask together: all of a converged warp, those of a branch.
__global__ void active_kernel(unsigned* out) {
  out[threadIdx.x] = __activemask();
  if (threadIdx.x % 32 < 4) return;
  if (threadIdx.x % 3 == 0) out[64 + threadIdx.x] = __activemask();
}

void activemask() {
  std::vector<unsigned> out(128, 0);
  DYNEMB_LAUNCH(1, 40, nullptr, active_kernel)(out.data());
  unsigned threes = 0;
  for (unsigned lane = 4; lane < 32; ++lane) threes |= lane % 3 == 0 ? 1u << lane : 0u;
  for (unsigned t = 0; t < 40; ++t) {
    expect(out[t] == (t < 32 ? kFull : 0xffu), "__activemask of a converged (partial) warp");
    if (t < 32 && t >= 4 && t % 3 == 0) expect(out[64 + t] == threes, "__activemask inside a branch");
  }
  // warp 1 holds threads 32..39: lanes 4..7 of it are threads 36..39, of which 36 and 39
  // are multiples of 3 (lanes 4 and 7).
  expect(out[64 + 36] == 0x90u && out[64 + 39] == 0x90u, "__activemask inside a branch of a partial warp");
}

// ---------------------------------------------------------------- a lock inside a block
__global__ void locked_count_kernel(int* lock, int* count) {
  while (atomicCAS(lock, 0, 1) != 0) DYNEMB_SPIN_PAUSE();
  __threadfence();  // CUDA's atomics are relaxed: the fences order the count
  const int seen = *count;
  DYNEMB_SPIN_PAUSE();  // the holder is set aside while its block's other threads spin
  *count = seen + 1;
  __threadfence();
  atomicExch(lock, 0);
}

void spin_lock() {
  int lock = 0, count = 0;
  DYNEMB_LAUNCH(4, 256, nullptr, locked_count_kernel)(&lock, &count);
  expect(count == 1024, "a spin lock shared by 1,024 threads counted " + std::to_string(count));
}

// ---------------------------------------------------------------- errors, never hangs
__global__ void early_exit_kernel(int* out) {
  if (threadIdx.x == 5) return;
  out[threadIdx.x] = __shfl_sync(kFull, static_cast<int>(threadIdx.x), 0);
}
__global__ void divergent_barrier_kernel(int* out) {
  if (threadIdx.x < 128) __syncthreads();
  out[threadIdx.x] = 1;
}
__global__ void two_barriers_kernel(int* out) {
  if (threadIdx.x % 2 == 0) {
    __syncthreads();
  } else {
    __syncthreads();
  }
  out[threadIdx.x] = 1;
}
__global__ void self_excluded_kernel(int* out) { out[threadIdx.x] = __ballot_sync(0x1u, 1); }
__global__ void outside_source_kernel(int* out) {
  if (threadIdx.x >= 16) return;
  out[threadIdx.x] = __shfl_sync(0xffffu, 1, 20);
}
__global__ void bad_width_kernel(int* out) { out[threadIdx.x] = __shfl_sync(kFull, 1, 0, 3); }
__global__ void mismatched_kernel(int* out) {
  if (threadIdx.x < 16) {
    out[threadIdx.x] = static_cast<int>(__ballot_sync(kFull, 1));
  } else {
    out[threadIdx.x] = __shfl_sync(kFull, 1, 0);
  }
}
__global__ void misaligned_load_kernel(const uint8_t* digests, int* out) {
  out[threadIdx.x] = static_cast<int>(dynemb::cuda_emulated::CgTile<8>().match<16>(digests + 8, 0));
}
__global__ void misaligned_atomic_kernel(int* out) {
  atomicAdd(reinterpret_cast<int*>(reinterpret_cast<char*>(out) + 2), 1);
}
__global__ void late_block_kernel(int* out) {
  if (blockIdx.x == 6 && threadIdx.x == 3) return;
  __syncwarp();
  out[blockIdx.x * blockDim.x + threadIdx.x] = 1;
}

void errors() {
  std::vector<int> out(4096);
  int* o = out.data();
  expect_error([&] { DYNEMB_LAUNCH(1, 32, nullptr, early_exit_kernel)(o); },
               {"early_exit_kernel", "lane 5 of warp 0 never reaches __shfl_sync", "it exited",
                "lockstep_kernels.cpp:", "DYNEMB_EMULATION_SEED="});
  expect_error([&] { DYNEMB_LAUNCH(1, 256, nullptr, divergent_barrier_kernel)(o); },
               {"divergent_barrier_kernel", "__syncthreads", "divergent code"});
  expect_error([&] { DYNEMB_LAUNCH(1, 64, nullptr, two_barriers_kernel)(o); },
               {"two_barriers_kernel", "different call sites"});
  expect_error([&] { DYNEMB_LAUNCH(1, 32, nullptr, self_excluded_kernel)(o); },
               {"self_excluded_kernel", "leaves the lane itself out"});
  expect_error([&] { DYNEMB_LAUNCH(1, 32, nullptr, outside_source_kernel)(o); },
               {"outside_source_kernel", "reads lane 20", "leaves out"});
  expect_error([&] { DYNEMB_LAUNCH(1, 32, nullptr, bad_width_kernel)(o); },
               {"bad_width_kernel", "width 3"});
  expect_error([&] { DYNEMB_LAUNCH(1, 32, nullptr, mismatched_kernel)(o); },
               {"mismatched_kernel", "never reaches", "it waits at"});
  expect_error([&] { DYNEMB_LAUNCH(16, 64, nullptr, late_block_kernel)(o); },
               {"late_block_kernel", "block 6", "lane 3 of warp 0"});
  // A GPU faults on a misaligned vector load or atomic (cudaErrorMisalignedAddress).
  alignas(16) static uint8_t digests[32] = {};
  expect_error([&] { DYNEMB_LAUNCH(1, 8, nullptr, misaligned_load_kernel)(digests, o); },
               {"misaligned_load_kernel", "misaligned address: a vector load of 16 bytes",
                "tile.cuh:"});
  expect_error([&] { DYNEMB_LAUNCH(1, 32, nullptr, misaligned_atomic_kernel)(o); },
               {"misaligned_atomic_kernel", "misaligned address: an atomic of 4 bytes",
                "lockstep_kernels.cpp:"});
  // The pool serves the next launch as before.
  std::vector<int> in(256, 1), sum(1);
  DYNEMB_LAUNCH(1, 256, nullptr, block_sum_kernel)(in.data(), sum.data());
  expect(sum[0] == 256, "a launch after the errors");
}

// ---------------------------------------------------------------- the drawn lane order
__global__ void order_kernel(int* next, int* order) { order[atomicAdd(next, 1)] = static_cast<int>(threadIdx.x); }

void print_order() {
  for (int launch = 0; launch < 2; ++launch) {
    int next = 0;
    std::vector<int> order(64);
    DYNEMB_LAUNCH(1, 64, nullptr, order_kernel)(&next, order.data());
    for (int t : order) std::printf("%d ", t);
    std::printf("\n");
  }
}

}  // namespace

int main(int argc, char** argv) {
  const std::map<std::string, void (*)()> cases = {
      {"shuffles", shuffles},     {"shuffle_types", shuffle_types},
      {"votes", votes},           {"match_and_reduce", match_and_reduce},
      {"syncwarp", syncwarp_orders}, {"syncthreads_shared", syncthreads_shared},
      {"tiles", tiles},           {"activemask", activemask},
      {"spin_lock", spin_lock},   {"errors", errors},
  };
  if (argc == 2 && std::string(argv[1]) == "order") {
    print_order();
    return 0;
  }
  if (argc == 2 && std::string(argv[1]) == "list") {
    for (const auto& [name, run] : cases) std::printf("%s\n", name.c_str());
    return 0;
  }
  for (int a = 1; a < argc; ++a) {
    const auto found = cases.find(argv[a]);
    if (found == cases.end()) {
      std::printf("no case %s\n", argv[a]);
      return 2;
    }
    found->second();
    if (!failure.empty()) {
      std::printf("%s: %s (DYNEMB_EMULATION_SEED=%llu)\n", argv[a], failure.c_str(),
                  static_cast<unsigned long long>(dynemb::emulation::lane_order_seed()));
      return 1;
    }
  }
  std::printf("ok\n");
  return 0;
}
