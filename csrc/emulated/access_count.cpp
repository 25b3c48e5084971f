// dynemb emulated CUDA executor: the count of table bytes and lines ops access
// (core/access_count.h), for benchmark/count_bytes_per_key.py.
//
// While on, every access a TableRef accessor reports lands in a set per kind: the
// distinct bytes and the distinct 64-byte lines since the last reset. Distinct, so that
// the lanes of a tile reading one word together count it once, as one load of a GPU
// does, and a second read of a line in one op costs nothing, as the cache keeps it.
// A mutex guards the sets: a lane never yields while it holds it (no collective inside).
#include <atomic>
#include <cstdint>
#include <mutex>
#include <unordered_set>
#include <vector>

#include "core/access_count.h"

namespace dynemb::emulation {
namespace {

std::atomic<bool> counting{false};
std::mutex sets_mutex;
std::unordered_set<uintptr_t> bytes_seen[kAccessKinds];
std::unordered_set<uintptr_t> lines_seen[kAccessKinds];
std::unordered_set<uintptr_t> lines_either[2];  // metadata, rows: read or written

void clear() {
  for (auto& s : bytes_seen) s.clear();
  for (auto& s : lines_seen) s.clear();
  for (auto& s : lines_either) s.clear();
}

}  // namespace

void count_access(int kind, const void* p, int64_t bytes) {
  if (!counting.load(std::memory_order_relaxed) || bytes <= 0) return;
  const auto a = reinterpret_cast<uintptr_t>(p);
  std::lock_guard<std::mutex> lock(sets_mutex);
  for (int64_t k = 0; k < bytes; ++k) bytes_seen[kind].insert(a + static_cast<uintptr_t>(k));
  const uintptr_t last = (a + static_cast<uintptr_t>(bytes) - 1) >> 6;
  for (uintptr_t line = a >> 6; line <= last; ++line) {
    lines_seen[kind].insert(line);
    lines_either[kind / 2].insert(line);
  }
}

std::vector<int64_t> access_counts(bool reset) {
  std::lock_guard<std::mutex> lock(sets_mutex);
  std::vector<int64_t> out;
  for (const auto& s : bytes_seen) out.push_back(static_cast<int64_t>(s.size()));
  for (const auto& s : lines_seen) out.push_back(static_cast<int64_t>(s.size()));
  for (const auto& s : lines_either) out.push_back(static_cast<int64_t>(s.size()));
  if (reset) clear();
  return out;
}

void count_accesses(bool on) {
  std::lock_guard<std::mutex> lock(sets_mutex);
  clear();
  counting.store(on, std::memory_order_relaxed);
}

}  // namespace dynemb::emulation
