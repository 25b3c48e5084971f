// dynemb CUDA executor: every kernel launch checked, and a failure that names its kernel.
//
// DYNEMB_LAUNCH (runtime.cuh) runs each launch through check_launch_shape before it and
// check_launch after it, in both builds (nvcc's and the emulation's), so that:
//   - an empty grid launches nothing (CUDA refuses a grid of 0 blocks as an invalid
//     configuration; a batch of no keys is not an error);
//   - a grid or block CUDA would refuse (more than 2^31 - 1 blocks, more than 1024
//     threads) is refused before it runs, on the emulator too;
//   - a launch error (cudaGetLastError) raises at once, and with DYNEMB_CUDA_SYNC_LAUNCHES=1
//     every launch synchronises its stream, so that a fault inside a kernel raises at the
//     kernel that made it (launches are asynchronous: without it a fault surfaces at a
//     later call, attributed to whatever runs then).
// The error names the kernel, the op that launched it and that op's table (its buckets,
// slots per bucket, row width and dtype): the op sets this thread's LaunchContext through
// an OpScope (csrc/torch: every registered op), and check_table records the table.
//
// Torch-free and CUDA-free (plain C++): the torch layer includes it to set the context.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>

namespace dynemb {

/// What this thread's current op is doing, for launch errors.
struct LaunchContext {
  const char* op = nullptr;  // a static string (the op's registered name)
  int64_t num_buckets = 0;   // 0: the op has no table
  int64_t bucket_capacity = 0;
  int64_t row_width = 0;
  const char* dtype = "";  // a static string
};

inline LaunchContext& launch_context() {
  thread_local LaunchContext context;
  return context;
}

/// The op `name` runs on this thread until the scope ends (the previous context returns).
class OpScope {
 public:
  explicit OpScope(const char* name) : saved_(launch_context()) {
    launch_context() = LaunchContext{name};
  }
  ~OpScope() { launch_context() = saved_; }
  OpScope(const OpScope&) = delete;
  OpScope& operator=(const OpScope&) = delete;

 private:
  LaunchContext saved_;
};

/// The table the current op works on (check_table calls it).
inline void record_launch_table(int64_t num_buckets, int64_t bucket_capacity, int64_t row_width,
                                const char* dtype) {
  LaunchContext& c = launch_context();
  c.num_buckets = num_buckets;
  c.bucket_capacity = bucket_capacity;
  c.row_width = row_width;
  c.dtype = dtype;
}

/// DYNEMB_CUDA_SYNC_LAUNCHES=1: every launch waits for its kernel and checks its outcome.
inline bool sync_launches() {
  static const bool on = [] {
    const char* v = std::getenv("DYNEMB_CUDA_SYNC_LAUNCHES");
    return v != nullptr && std::strcmp(v, "1") == 0;
  }();
  return on;
}

/// Raises the error of kernel `kernel` (its source text: name and template arguments),
/// which failed with `what`; `synced`: the failure is known to be this kernel's.
[[noreturn]] inline void throw_launch_error(const char* kernel, const std::string& what,
                                            bool synced) {
  const LaunchContext& c = launch_context();
  std::string message = std::string("dynemb: CUDA kernel `") + kernel + "` of op `" +
                        (c.op != nullptr ? c.op : "(unknown)") + "`";
  if (c.num_buckets > 0) {
    char table[160];
    std::snprintf(table, sizeof table,
                  " on a table of %lld buckets x %lld slots, rows of %lld %s columns",
                  static_cast<long long>(c.num_buckets), static_cast<long long>(c.bucket_capacity),
                  static_cast<long long>(c.row_width), c.dtype);
    message += table;
  }
  message += " failed: " + what;
  if (!synced) {
    message +=
        " (launches are asynchronous: the fault may be an earlier kernel's; run with "
        "DYNEMB_CUDA_SYNC_LAUNCHES=1 to raise at the kernel that made it)";
  }
  throw std::runtime_error(message);
}

/// Whether a launch of `grid` blocks of `block` threads runs: false for an empty grid
/// (nothing to do); raises for a shape CUDA refuses (1-D grids: x only).
inline bool check_launch_shape(const char* kernel, uint64_t grid, uint64_t block) {
  constexpr uint64_t kMaxGrid = (uint64_t{1} << 31) - 1, kMaxBlock = 1024;
  if (grid == 0) return false;
  if (block == 0 || block > kMaxBlock || grid > kMaxGrid) {
    throw_launch_error(kernel,
                       "invalid configuration argument (grid of " + std::to_string(grid) +
                           " blocks of " + std::to_string(block) + " threads; CUDA takes 1 to " +
                           std::to_string(kMaxGrid) + " blocks of 1 to 1024 threads)",
                       true);
  }
  return true;
}

}  // namespace dynemb
