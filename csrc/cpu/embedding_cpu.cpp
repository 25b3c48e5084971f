// dynemb CPU executor: see embedding_cpu.h.
#include "cpu/embedding_cpu.h"

#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <vector>

#include "cpu/cpu_platform.h"

namespace dynemb::cpu {

namespace {
constexpr int64_t kBagGrain = 64;
constexpr int64_t kRowGrain = 256;
constexpr int64_t kUpdateDistance = 8;  // rows ahead whose lines the update prefetches
// Bags ahead whose output (pool) or gradient (backward) lines are prefetched: a
// module's output is strided (one row of every feature per sample), so the hardware
// prefetchers do not follow its columns and each bag would wait for its lines.
constexpr int64_t kBagDistance = 4;

/// Prefetches every cache line of a row (a row is several lines: the first alone
/// leaves the others to demand misses).
template <class V>
DYNEMB_INLINE void prefetch_row(const TableRef<V>& t, int64_t slot) {
  CpuPlatform::prefetch_lines(t.row(slot), t.row_width * static_cast<int64_t>(sizeof(V)));
}

/// A buffer of n elements of T (contents unspecified), reused by the calling thread:
/// a fresh multi-MB allocation per backward page-faults (and the kernel zero-fills
/// it) on every call.
template <class T = float>
T* scratch(int64_t n) {
  thread_local std::vector<T> buffer;
  if (static_cast<int64_t>(buffer.size()) < n) buffer.resize(static_cast<size_t>(n));
  return buffer.data();
}

/// Pools bags [b0, b1) of one part.
template <class V>
void pool_bags(const PoolPart<V>& p, PoolingMode mode, int64_t b0, int64_t b1);

/// Pools bags [b0, b1) of a part whose slots come per distinct key (IndexSlots with
/// an inverse): their indices' slots are gathered first, in one tight loop over the
/// range (its random reads of unique_slots overlap), then pooled as slots per index.
/// Reading them through the inverse inside the pooling loop instead put a dependent
/// load in front of every row (W-train: pooling 43 -> 49-59 ms a step).
template <class V>
void pool_bags_by_key(const PoolPart<V>& p, PoolingMode mode, int64_t b0, int64_t b1) {
  const int64_t i0 = p.offsets[b0], i1 = p.offsets[b1];
  int64_t* const local = scratch<int64_t>(i1);  // entries [i0, i1) used
  for (int64_t i = i0; i < i1; ++i) local[i] = p.slots[i];
  PoolPart<V> per_index = p;
  per_index.slots = IndexSlots{local, nullptr};
  pool_bags(per_index, mode, b0, b1);
}

template <class V>
void pool_bags(const PoolPart<V>& p, PoolingMode mode, int64_t b0, int64_t b1) {
  const int64_t bytes = p.dim * static_cast<int64_t>(sizeof(float));
  // A bag is summed in a cached row, then stored: pool_bag's read-modify-writes
  // would otherwise wait on the output's (strided, not yet cached) lines.
  float* const sum = scratch(p.dim);
  for (int64_t b = b0; b < b1; ++b) {
    if (b + kBagDistance < b1) {
      CpuPlatform::prefetch_lines_for_write(p.out.at(b + kBagDistance), bytes);
    }
    // Prefetch the rows of the next bag while pooling this one.
    if (b + 1 < b1) {
      for (int64_t i = p.offsets[b + 1]; i < p.offsets[b + 2]; ++i) {
        const int64_t slot = p.slots[i];
        if (slot >= 0) prefetch_row(p.table, slot);
      }
    }
    pool_part_bag(p, mode, b, sum);
    std::copy(sum, sum + p.dim, p.out.at(b));
  }
}

}  // namespace

template <class V>
void pool(const PoolPart<V>* parts, int64_t count, PoolingMode mode) {
  if (count == 0) return;
  const Parts<PoolPart<V>> all{parts, {}, count};
  const int64_t total = parts[count - 1].bag_begin + parts[count - 1].num_bags;
  at::parallel_for(0, total, kBagGrain, [&](int64_t begin, int64_t end) {
    // A range of the batch's bags may span several parts: each gets its own share.
    for (int64_t x = begin; x < end;) {
      const PoolPart<V>& p = part_of(all, x, &PoolPart<V>::bag_begin);
      const int64_t b0 = x - p.bag_begin;
      const int64_t b1 = std::min(end - p.bag_begin, p.num_bags);
      if (p.slots.inverse != nullptr) {
        pool_bags_by_key(p, mode, b0, b1);
      } else {
        pool_bags(p, mode, b0, b1);
      }
      x = p.bag_begin + b1;
    }
  });
}

template <class V>
void gather(const TableRef<V>& t, const int64_t* slots, const int64_t* keys, int64_t n,
            const InitArgs& missing, float* out, int64_t dim) {
  at::parallel_for(0, n, kRowGrain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) gather_row(t, slots, keys, i, missing, out + i * dim, dim);
  });
}

namespace {

/// The gradients of one part's distinct keys [u0, u1), summed in acc ((u1 - u0) * dim
/// floats) in ascending index order (the rule of core/pooling.h), scanning the part's
/// bags, then the updates of their rows.
template <class V>
void backward_task(const BackwardPart<V>& p, PoolingMode mode, const OptimizerArgs& opt,
                   int64_t u0, int64_t u1, float* acc) {
  const int64_t dim = p.dim;
  const int64_t grad_bytes = dim * static_cast<int64_t>(sizeof(float));
  std::fill(acc, acc + (u1 - u0) * dim, 0.0f);
  for (int64_t b = 0; b < p.num_bags; ++b) {
    if (b + kBagDistance < p.num_bags) {
      CpuPlatform::prefetch_lines(p.grad.at(b + kBagDistance), grad_bytes);
    }
    const float* g = p.grad.at(b);
    for (int64_t i = p.offsets[b]; i < p.offsets[b + 1]; ++i) {
      const int64_t u = p.inverse[i];
      if (u < u0 || u >= u1 || p.unique_slots[u] < 0) continue;
      add_gradient(acc + (u - u0) * dim,
                   grad_scale(mode, p.weights, i, p.offsets[b], p.offsets[b + 1]), g, dim);
    }
  }
  for (int64_t u = u0; u < u1; ++u) {
    const int64_t ahead = u + kUpdateDistance;
    if (ahead < u1 && p.unique_slots[ahead] >= 0) prefetch_row(p.table, p.unique_slots[ahead]);
    if (p.unique_slots[u] >= 0) {
      update_row(opt, p.table.row(p.unique_slots[u]), dim, acc + (u - u0) * dim);
    }
  }
}

}  // namespace

template <class V>
void backward_update(const BackwardPart<V>* parts, int64_t count, PoolingMode mode,
                     const OptimizerArgs& opt) {
  // Tasks: per part, about one range of its distinct keys per thread (at least 64
  // keys each); a task scans its part's batch and updates its keys' rows, summing in
  // its thread's scratch (one table's share at a time: it stays in the caches).
  struct Task {
    int64_t part, u0, u1;
  };
  std::vector<Task> tasks;
  for (int64_t p = 0; p < count; ++p) {
    const int64_t u = parts[p].num_unique;
    if (u == 0) continue;
    const int64_t k = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), u / 64));
    for (int64_t j = 0; j < k; ++j) tasks.push_back({p, u * j / k, u * (j + 1) / k});
  }
  at::parallel_for(0, static_cast<int64_t>(tasks.size()), 1, [&](int64_t begin, int64_t end) {
    for (int64_t j = begin; j < end; ++j) {
      const Task& task = tasks[j];
      const BackwardPart<V>& p = parts[task.part];
      float* const acc = scratch((task.u1 - task.u0) * p.dim);
      backward_task(p, mode, opt, task.u0, task.u1, acc);
    }
  });
}

#define DYNEMB_INSTANTIATE(V)                                                                    \
  template void pool<V>(const PoolPart<V>*, int64_t, PoolingMode);                             \
  template void gather<V>(const TableRef<V>&, const int64_t*, const int64_t*, int64_t,           \
                          const InitArgs&, float*, int64_t);                                     \
  template void backward_update<V>(const BackwardPart<V>*, int64_t, PoolingMode,               \
                                   const OptimizerArgs&);

DYNEMB_INSTANTIATE(float)
DYNEMB_INSTANTIATE(c10::Half)
DYNEMB_INSTANTIATE(c10::BFloat16)

}  // namespace dynemb::cpu
