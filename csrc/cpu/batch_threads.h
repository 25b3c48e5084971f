// dynemb CPU executor: how many threads a batch op runs on.
#pragma once

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>

namespace dynemb::cpu {

constexpr int64_t kGrain = 2048;  // keys per task below which one thread runs a batch

inline int threads_for(int64_t n) {
  return n < 2 * kGrain ? 1 : std::max(1, at::get_num_threads());
}

}  // namespace dynemb::cpu
