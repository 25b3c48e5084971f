// dynemb CPU executor: how many threads a batch op runs on, and how the positions its
// threads leave to one thread's second pass are put back in batch order.
#pragma once

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <vector>

namespace dynemb::cpu {

constexpr int64_t kGrain = 2048;  // keys per task below which one thread runs a batch

inline int threads_for(int64_t n) {
  return n < 2 * kGrain ? 1 : std::max(1, at::get_num_threads());
}

/// The positions each thread's pass 1 left (`lists`, one per thread), merged into the
/// order `before` says (a strict order; by default ascending positions) for the pass 2
/// that one thread runs after it: the batch rule's order (core/table_ops.h).
template <class Before = std::less<int64_t>>
std::vector<int64_t> merged_in_order(const std::vector<std::vector<int64_t>>& lists,
                                     Before before = {}) {
  std::vector<int64_t> all;
  for (const auto& l : lists) all.insert(all.end(), l.begin(), l.end());
  std::sort(all.begin(), all.end(), before);
  return all;
}

}  // namespace dynemb::cpu
