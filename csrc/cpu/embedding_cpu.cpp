// dynemb CPU executor: see embedding_cpu.h.
#include "cpu/embedding_cpu.h"

#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <vector>

#include "cpu/cpu_platform.h"
#include "cpu/executor_cpu.h"

namespace dynemb::cpu {

namespace {
constexpr int64_t kBagGrain = 64;
constexpr int64_t kRowGrain = 256;
}  // namespace

template <class V>
StatusCounts find_or_insert_slots(const SlotSink<V>& sink, const UpsertArgs& args,
                                  const int64_t* keys, int64_t n, int8_t* status) {
  return upsert_batch_with(sink.t, sink, args, keys, n, status);
}

template <class V>
void pool(const TableRef<V>& t, const int64_t* slots, const int64_t* keys,
          const int64_t* offsets, int64_t num_bags, const float* weights, PoolingMode mode,
          const InitArgs& missing, float* out, int64_t dim) {
  at::parallel_for(0, num_bags, kBagGrain, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      // Prefetch the rows of the next bag while pooling this one.
      if (b + 1 < end) {
        for (int64_t i = offsets[b + 1]; i < offsets[b + 2]; ++i) {
          if (slots[i] >= 0) CpuPlatform::prefetch(t.row(slots[i]));
        }
      }
      pool_bag(t, slots, keys, weights, offsets[b], offsets[b + 1], mode, missing,
               out + b * dim, dim);
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
int64_t backward_update(const TableRef<V>& t, const int64_t* slots, const int64_t* offsets,
                        int64_t num_bags, const float* weights, PoolingMode mode,
                        const float* grad, int64_t dim, const OptimizerArgs& opt,
                        int32_t* uid_scratch) {
  const int64_t n = offsets[num_bags];
  // Pass 1: a dense id per distinct slot, in first-occurrence order.
  std::vector<int32_t> uid(n);
  std::vector<int64_t> unique_slots;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t s = slots[i];
    if (s < 0) {
      uid[i] = -1;
      continue;
    }
    int32_t u = uid_scratch[s];
    if (u < 0) {
      u = static_cast<int32_t>(unique_slots.size());
      uid_scratch[s] = u;
      unique_slots.push_back(s);
    }
    uid[i] = u;
  }
  const int64_t num_unique = static_cast<int64_t>(unique_slots.size());
  // Pass 2: sum every index's gradient into its row's accumulator, in index order.
  std::vector<float> acc(static_cast<size_t>(num_unique * dim), 0.0f);
  for (int64_t b = 0; b < num_bags; ++b) {
    const float* g = grad + b * dim;
    for (int64_t i = offsets[b]; i < offsets[b + 1]; ++i) {
      if (uid[i] < 0) continue;
      const float c = grad_scale(mode, weights, i, offsets[b], offsets[b + 1]);
      float* a = acc.data() + static_cast<int64_t>(uid[i]) * dim;
      for (int64_t j = 0; j < dim; ++j) a[j] += c * g[j];
    }
  }
  // Pass 3: one fused optimizer update per distinct row, rows in parallel.
  at::parallel_for(0, num_unique, kRowGrain, [&](int64_t begin, int64_t end) {
    for (int64_t u = begin; u < end; ++u) {
      update_row(opt, t.row(unique_slots[u]), dim, acc.data() + u * dim);
      uid_scratch[unique_slots[u]] = -1;
    }
  });
  return num_unique;
}

#define DYNEMB_INSTANTIATE(V)                                                                    \
  template StatusCounts find_or_insert_slots<V>(const SlotSink<V>&, const UpsertArgs&,           \
                                                const int64_t*, int64_t, int8_t*);               \
  template void pool<V>(const TableRef<V>&, const int64_t*, const int64_t*, const int64_t*,      \
                        int64_t, const float*, PoolingMode, const InitArgs&, float*, int64_t);   \
  template void gather<V>(const TableRef<V>&, const int64_t*, const int64_t*, int64_t,           \
                          const InitArgs&, float*, int64_t);                                     \
  template int64_t backward_update<V>(const TableRef<V>&, const int64_t*, const int64_t*,        \
                                      int64_t, const float*, PoolingMode, const float*, int64_t, \
                                      const OptimizerArgs&, int32_t*);

DYNEMB_INSTANTIATE(float)
DYNEMB_INSTANTIATE(c10::Half)
DYNEMB_INSTANTIATE(c10::BFloat16)

}  // namespace dynemb::cpu
