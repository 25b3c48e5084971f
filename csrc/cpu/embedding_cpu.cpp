// dynemb CPU executor: see embedding_cpu.h.
#include "cpu/embedding_cpu.h"

#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "cpu/cpu_platform.h"
#include "cpu/row_lanes.h"

namespace dynemb::cpu {

namespace {
constexpr int64_t kBagGrain = 64;
constexpr int64_t kRowGrain = 256;
constexpr int64_t kUpdateDistance = 8;  // rows ahead whose lines the update prefetches
// Bags ahead whose output (pool) or gradient (backward) lines are prefetched: a
// module's output is strided (one row of every feature per sample), so the hardware
// prefetchers do not follow its columns and each bag would wait for its lines.
constexpr int64_t kBagDistance = 4;
// Indices past the current bag whose rows the pooling prefetches. The next bag alone
// was too near for small bags (W-train-wide, 4 indices a bag: the pooling waited on its
// rows; 16 indices ahead cut it from ~21 to ~19 ms a step, 1 thread, medians of 3).
constexpr int64_t kRowDistance = 16;

/// Prefetches every cache line of a row (a row is several lines: the first alone
/// leaves the others to demand misses).
template <class V>
DYNEMB_INLINE void prefetch_row(const TableRef<V>& t, int64_t slot) {
  CpuPlatform::prefetch_lines(t.row(slot), t.row_width * static_cast<int64_t>(sizeof(V)));
}

/// Prefetches every cache line holding a byte of [addr, addr + bytes).
DYNEMB_INLINE void prefetch_span(const void* addr, int64_t bytes) {
  const uintptr_t begin = reinterpret_cast<uintptr_t>(addr);
  for (uintptr_t line = begin & ~uintptr_t{63}; line < begin + bytes; line += 64) {
    CpuPlatform::prefetch(reinterpret_cast<const void*>(line));
  }
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

/// Calls pool_one(b, out) for bags [b0, b1) of one part, out the bag's place, while
/// prefetching the rows of the indices up to kRowDistance past the bag and the output
/// lines kBagDistance bags ahead.
template <class V, class PoolOne>
DYNEMB_INLINE void for_each_bag(const PoolPart<V>& p, int64_t b0, int64_t b1, PoolOne&& pool_one) {
  const int64_t out_bytes = p.dim * static_cast<int64_t>(sizeof(float));
  const int64_t row_bytes = p.dim * static_cast<int64_t>(sizeof(V));  // not the state
  const int64_t last = p.offsets[b1];
  int64_t ahead = p.offsets[b0];
  for (int64_t b = b0; b < b1; ++b) {
    if (b + kBagDistance < b1) {
      CpuPlatform::prefetch_lines_for_write(p.out.at(b + kBagDistance), out_bytes);
    }
    const int64_t until = std::min(p.offsets[b + 1] + kRowDistance, last);
    for (; ahead < until; ++ahead) {
      const int64_t slot = p.slots[ahead];
      if (slot >= 0) prefetch_span(p.table.row(slot), row_bytes);
    }
    pool_one(b, p.out.at(b));
  }
}

/// pool_bag of bag b for float rows of dim kDim (row_lanes.h), into out; false, with
/// nothing written, when an index of the bag has no stored row (pool_bag draws it).
/// An unweighted term is added: pool_bag's fmaf(1.0f, x, acc) is acc + x.
template <int64_t kDim>
DYNEMB_INLINE bool pool_stored_bag(const PoolPart<float>& p, PoolingMode mode, int64_t b,
                                   float* out) {
  const int64_t begin = p.offsets[b], end = p.offsets[b + 1];
  auto sum = LaneRow<kDim>::zeros();
  for (int64_t i = begin; i < end; ++i) {
    const int64_t slot = p.slots[i];
    if (slot < 0) return false;
    if (p.weights == nullptr) {
      sum.add(p.table.row(slot));
    } else {
      sum.add_fused(p.weights[i], p.table.row(slot));
    }
  }
  if (mode == PoolingMode::kMean && end > begin) sum.scale(1.0f / static_cast<float>(end - begin));
  sum.store(out);
  return true;
}

template <class V>
void pool_bags(const PoolPart<V>& p, PoolingMode mode, int64_t b0, int64_t b1) {
  // A bag is summed in registers or in a cached row, then stored: pool_bag's
  // read-modify-writes would otherwise wait on the output's (strided, not yet
  // cached) lines.
  float* const sum = scratch(p.dim);
  auto generic = [&](int64_t b, float* out) {
    pool_part_bag(p, mode, b, sum);
    std::copy(sum, sum + p.dim, out);
  };
  if constexpr (std::is_same_v<V, float>) {
    const bool done = with_lane_dim(p.dim, [&](auto dim) {
      for_each_bag(p, b0, b1, [&](int64_t b, float* out) {
        if (!pool_stored_bag<decltype(dim)::value>(p, mode, b, out)) generic(b, out);
      });
    });
    if (done) return;
  }
  for_each_bag(p, b0, b1, generic);
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

/// A term of a distinct key's gradient: grad_scale(i) * the row g of index i's bag.
struct GradTerm {
  const float* g;
  float scale;
};

/// The gradients of one part's distinct keys [u0, u1), each summed over its indices in
/// ascending index order, in chunks (the rule of core/pooling.h), then the updates of
/// their rows.
/// The indices' terms are first grouped by key (a counting sort, stable, so each
/// key's terms stay in ascending index order); each key's gradient is then summed in
/// one row that stays in L1 and its row updated at once. Summing in a per-key
/// accumulator of the whole range instead scattered every index's read-modify-write
/// over (u1 - u0) * dim floats (W-train: 5.5 MB a table, beyond L2).
template <class V>
void backward_task(const BackwardPart<V>& p, PoolingMode mode, const OptimizerArgs& opt,
                   int64_t u0, int64_t u1) {
  const int64_t dim = p.dim;
  const int64_t keys = u1 - u0;
  // end[k]: after the fill, one past the last term of key u0 + k (its first is end[k - 1],
  // or 0); before it, the next free place of that key.
  int64_t* const end = scratch<int64_t>(keys + 1);
  std::fill(end, end + keys + 1, 0);
  for (int64_t i = 0; i < p.num_indices; ++i) {
    const int64_t u = p.inverse[i];
    if (u >= u0 && u < u1) ++end[u - u0 + 1];
  }
  for (int64_t k = 1; k <= keys; ++k) end[k] += end[k - 1];
  GradTerm* const terms = scratch<GradTerm>(end[keys]);
  for (int64_t b = 0; b < p.num_bags; ++b) {
    const float* g = p.grad.at(b);
    for (int64_t i = p.offsets[b]; i < p.offsets[b + 1]; ++i) {
      const int64_t u = p.inverse[i];
      if (u < u0 || u >= u1) continue;
      terms[end[u - u0]++] = {g, grad_scale(mode, p.weights, i, p.offsets[b], p.offsets[b + 1])};
    }
  }
  float* const acc = scratch(2 * dim);
  float* const chunk_acc = acc + dim;  // one chunk's sum (a key of > kGradientChunk terms)
  // Calls update(k0, k1, row, key) for each stored key, its terms [k0, k1) and row.
  auto for_each_key = [&](auto&& update) {
    for (int64_t u = u0; u < u1; ++u) {
      const int64_t ahead = u + kUpdateDistance;
      if (ahead < u1 && p.unique_slots[ahead] >= 0) prefetch_row(p.table, p.unique_slots[ahead]);
      const int64_t slot = p.unique_slots[u];
      if (slot < 0) continue;
      update(u == u0 ? 0 : end[u - u0 - 1], end[u - u0], p.table.row(slot), p.table.key(slot));
    }
  };
  const bool done = with_lane_dim(dim, [&](auto lane_dim) {
    constexpr int64_t kDim = decltype(lane_dim)::value;
    auto chunk = [&](int64_t k0, int64_t k1) {  // add_gradient's terms, in registers
      auto sum = LaneRow<kDim>::zeros();
      for (int64_t k = k0; k < k1; ++k) sum.add_scaled(terms[k].scale, terms[k].g);
      return sum;
    };
    auto gradient = [&](int64_t k0, int64_t k1) {  // core pooling.h's order
      if (k1 - k0 <= kGradientChunk) return chunk(k0, k1);
      auto total = LaneRow<kDim>::zeros();
      for (int64_t c = k0; c < k1; c += kGradientChunk) {
        total.add(chunk(c, std::min(c + kGradientChunk, k1)));
      }
      return total;
    };
    if constexpr (std::is_same_v<V, float>) {
      if (opt.kind == OptimizerKind::kRowwiseAdagrad) {
        for_each_key([&](int64_t k0, int64_t k1, float* row, int64_t) {
          rowwise_adagrad_update(opt, row, gradient(k0, k1));
        });
        return;
      }
    }
    // The dim as a constant: the update's loops have fixed trip counts.
    for_each_key([&](int64_t k0, int64_t k1, V* row, int64_t key) {
      gradient(k0, k1).store(acc);
      update_row(opt, row, kDim, acc, key);
    });
  });
  if (done) return;
  for_each_key([&](int64_t k0, int64_t k1, V* row, int64_t key) {
    std::fill(acc, acc + dim, 0.0f);
    if (k1 - k0 <= kGradientChunk) {
      for (int64_t k = k0; k < k1; ++k) add_gradient(acc, terms[k].scale, terms[k].g, dim);
    } else {
      for (int64_t c = k0; c < k1; c += kGradientChunk) {
        std::fill(chunk_acc, chunk_acc + dim, 0.0f);
        for (int64_t k = c; k < std::min(c + kGradientChunk, k1); ++k) {
          add_gradient(chunk_acc, terms[k].scale, terms[k].g, dim);
        }
        add_chunk(acc, chunk_acc, dim);
      }
    }
    update_row(opt, row, dim, acc, key);
  });
}

}  // namespace

template <class V>
void backward_update(const BackwardPart<V>* parts, int64_t count, PoolingMode mode,
                     const OptimizerArgs& opt) {
  // Tasks: per part, about one range of its distinct keys per thread (at least 64
  // keys each); a task scans its part's batch and updates its keys' rows, summing in
  // its thread's scratch.
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
      backward_task(parts[task.part], mode, opt, task.u0, task.u1);
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
