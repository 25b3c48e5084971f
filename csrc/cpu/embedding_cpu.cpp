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

/// A float buffer of n elements (contents unspecified), reused by the calling
/// thread: a fresh multi-MB allocation per backward page-faults (and the kernel
/// zero-fills it) on every call.
float* scratch(int64_t n) {
  thread_local std::vector<float> buffer;
  if (static_cast<int64_t>(buffer.size()) < n) buffer.resize(static_cast<size_t>(n));
  return buffer.data();
}
}  // namespace

template <class V>
void pool(const TableRef<V>& t, const int64_t* slots, const int64_t* keys,
          const int64_t* offsets, int64_t num_bags, const float* weights, PoolingMode mode,
          const InitArgs& missing, const BagRows<float>& out, int64_t dim) {
  const int64_t bytes = dim * static_cast<int64_t>(sizeof(float));
  at::parallel_for(0, num_bags, kBagGrain, [&](int64_t begin, int64_t end) {
    // A bag is summed in a cached row, then stored: pool_bag's read-modify-writes
    // would otherwise wait on the output's (strided, not yet cached) lines.
    float* const sum = scratch(dim);
    for (int64_t b = begin; b < end; ++b) {
      if (b + kBagDistance < end) {
        CpuPlatform::prefetch_lines_for_write(out.at(b + kBagDistance), bytes);
      }
      // Prefetch the rows of the next bag while pooling this one.
      if (b + 1 < end) {
        for (int64_t i = offsets[b + 1]; i < offsets[b + 2]; ++i) {
          if (slots[i] >= 0) prefetch_row(t, slots[i]);
        }
      }
      pool_bag(t, slots, keys, weights, offsets[b], offsets[b + 1], mode, missing, sum, dim);
      std::copy(sum, sum + dim, out.at(b));
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

template <class V>
void backward_update(const TableRef<V>& t, const int64_t* unique_slots, int64_t num_unique,
                     const int64_t* inverse, const int64_t* offsets, int64_t num_bags,
                     const float* weights, PoolingMode mode, const BagRows<const float>& grad,
                     int64_t dim, const OptimizerArgs& opt) {
  if (num_unique == 0) return;
  float* const acc = scratch(num_unique * dim);
  const int64_t grad_bytes = dim * static_cast<int64_t>(sizeof(float));
  // One task per thread owns a range of distinct keys: it sums the gradients of
  // their indices in ascending index order (the rule of core/pooling.h), scanning
  // the batch, and then updates their rows.
  const int64_t tasks = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), num_unique / 64));
  at::parallel_for(0, tasks, 1, [&](int64_t task_begin, int64_t task_end) {
    for (int64_t task = task_begin; task < task_end; ++task) {
      const int64_t u0 = num_unique * task / tasks, u1 = num_unique * (task + 1) / tasks;
      std::fill(acc + u0 * dim, acc + u1 * dim, 0.0f);
      for (int64_t b = 0; b < num_bags; ++b) {
        if (b + kBagDistance < num_bags) {
          CpuPlatform::prefetch_lines(grad.at(b + kBagDistance), grad_bytes);
        }
        const float* g = grad.at(b);
        for (int64_t i = offsets[b]; i < offsets[b + 1]; ++i) {
          const int64_t u = inverse[i];
          if (u < u0 || u >= u1 || unique_slots[u] < 0) continue;
          add_gradient(acc + u * dim, grad_scale(mode, weights, i, offsets[b], offsets[b + 1]),
                       g, dim);
        }
      }
      for (int64_t u = u0; u < u1; ++u) {
        const int64_t ahead = u + kUpdateDistance;
        if (ahead < u1 && unique_slots[ahead] >= 0) prefetch_row(t, unique_slots[ahead]);
        if (unique_slots[u] >= 0) update_row(opt, t.row(unique_slots[u]), dim, acc + u * dim);
      }
    }
  });
}

#define DYNEMB_INSTANTIATE(V)                                                                    \
  template void pool<V>(const TableRef<V>&, const int64_t*, const int64_t*, const int64_t*,      \
                        int64_t, const float*, PoolingMode, const InitArgs&,                 \
                        const BagRows<float>&, int64_t);                                       \
  template void gather<V>(const TableRef<V>&, const int64_t*, const int64_t*, int64_t,           \
                          const InitArgs&, float*, int64_t);                                     \
  template void backward_update<V>(const TableRef<V>&, const int64_t*, int64_t, const int64_t*,  \
                                   const int64_t*, int64_t, const float*, PoolingMode,          \
                                   const BagRows<const float>&, int64_t, const OptimizerArgs&);

DYNEMB_INSTANTIATE(float)
DYNEMB_INSTANTIATE(c10::Half)
DYNEMB_INSTANTIATE(c10::BFloat16)

}  // namespace dynemb::cpu
