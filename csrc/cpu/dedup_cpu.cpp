// dynemb CPU executor: see dedup_cpu.h.
#include "cpu/dedup_cpu.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <vector>

#include "cpu/cpu_platform.h"

namespace dynemb::cpu {

namespace {

/// Keys ahead whose home cell is prefetched: the set (512 KB for 65,536 keys) sits in
/// L2 at best, and a probe waits for its cell before the next key's can start.
constexpr int64_t kAhead = 16;

/// Cells kept by a thread between calls (16 MiB of uint32 ids: batches of up to 2M keys).
constexpr int64_t kKeptCells = int64_t{1} << 22;

/// The set's cells, zeroed: reused by the calling thread up to kKeptCells (a fresh
/// 512 KB+ allocation page-faults, and the kernel zero-fills it, on every call), in
/// `spare` for larger batches (so a thread keeps no huge buffer after one).
template <class Id>
Id* empty_cells(int64_t capacity, std::vector<Id>& spare) {
  thread_local std::vector<Id> kept;
  std::vector<Id>& cells = capacity <= kKeptCells ? kept : spare;
  if (static_cast<int64_t>(cells.size()) < capacity) cells.resize(static_cast<size_t>(capacity));
  std::memset(cells.data(), 0, static_cast<size_t>(capacity) * sizeof(Id));
  return cells.data();
}

template <class Id>
int64_t dedup_with(const int64_t* keys, int64_t n, int64_t* unique, int64_t* inverse,
                   int64_t* counts) {
  const int64_t capacity = dedup_capacity(n);
  std::vector<Id> spare;
  const DedupIdSetRef<Id> set{empty_cells<Id>(capacity, spare), capacity};
  int64_t cells[kAhead];  // home cell of key i at cells[i % kAhead]
  for (int64_t i = 0; i < std::min(n, kAhead); ++i) {
    cells[i] = dedup_home_cell(keys[i], capacity);
    CpuPlatform::prefetch(set.ids + cells[i]);
  }
  int64_t num_unique = 0;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t cell = cells[i % kAhead];
    if (i + kAhead < n) {
      const int64_t ahead = dedup_home_cell(keys[i + kAhead], capacity);
      cells[i % kAhead] = ahead;
      CpuPlatform::prefetch(set.ids + ahead);
    }
    const int64_t before = num_unique;
    const int64_t u = dedup_uid(set, cell, keys[i], unique, &num_unique);
    if (num_unique != before) counts[u] = 0;
    inverse[i] = u;
    ++counts[u];
  }
  return num_unique;
}

}  // namespace

int64_t dedup(const int64_t* keys, int64_t n, int64_t* unique, int64_t* inverse,
              int64_t* counts) {
  if (n < static_cast<int64_t>(std::numeric_limits<uint32_t>::max())) {
    return dedup_with<uint32_t>(keys, n, unique, inverse, counts);
  }
  return dedup_with<uint64_t>(keys, n, unique, inverse, counts);
}

void dedup(const DedupPart* parts, int64_t count, int64_t* unique, int64_t* inverse,
           int64_t* counts, int64_t* num_unique) {
  // Each part's dedup is sequential (its uids follow first occurrences); parts are
  // independent, so they run at once.
  at::parallel_for(0, count, 1, [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) {
      const DedupPart& q = parts[p];
      const int64_t at = q.index_begin;
      num_unique[p] = dedup(q.keys, q.n, unique + at, inverse + at, counts + at);
    }
  });
}

}  // namespace dynemb::cpu
