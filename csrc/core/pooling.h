// dynemb core: pooled and sequence lookups over slots, and the gradient they
// send back to each row.
//
// A batch arrives as fbgemm's TBE: `slots` (IndexSlots) gives the slot of each index
// (-1 when its key is not stored: the row is then the `missing` initializer's row
// for that key, zeros by default) and `offsets` (num_bags + 1) delimits the bags.
// SUM pools w_i * row_i over a bag; MEAN multiplies the sum by 1 / the bag's
// length; per-sample weights w_i (1 when absent). An empty bag pools to zeros. The
// gradient of index i in bag b is scale_b * w_i * grad_out[b], scale_b = 1 for
// SUM and 1 / len(b) for MEAN.
//
// Forward rounding, fbgemm's CPU TBE's (and nn.EmbeddingBag's for SUM): each
// element is summed in float from +0 in index order, a term at a time by one fused
// multiply-add, acc = fma(w_i, row_i[j], acc) (one rounding; unweighted, fma(1, x,
// acc) is acc + x); MEAN then multiplies by the float 1.0f / len, it does not divide
// (nn.EmbeddingBag divides: within one ulp of this). fmaf is explicit, so it holds
// under -ffp-contract=off / --fmad=false.
#pragma once

#include <math.h>

#include "core/initializer.h"
#include "core/table_ref.h"

namespace dynemb {

enum class PoolingMode : int64_t { kSum = 0, kMean = 1 };
/// Number of PoolingMode values (codes 0 .. kPoolingModeCount - 1).
constexpr int64_t kPoolingModeCount = static_cast<int64_t>(PoolingMode::kMean) + 1;
/// Their names, by code (DynamicEmbPoolingMode member names).
constexpr const char* kPoolingModeNames[kPoolingModeCount] = {"SUM", "MEAN"};

/// Where the dim floats of each bag live in a float matrix with row stride `stride`.
/// columns null: bag b is row b (a (num_bags, dim) matrix when stride == dim).
/// Otherwise the bags are feature-major, bags_per_feature (B) per feature, and bag b
/// is row b % B at column columns[b / B]: a table's bags written straight into (or
/// read from) its features' columns of a module's (B, total dim) output, so no
/// per-table temporary and copy exist.
template <class F>  // float (outputs) or const float (gradients)
struct BagRows {
  F* base;
  int64_t stride;
  const int64_t* columns;
  int64_t bags_per_feature;

  DYNEMB_HD DYNEMB_INLINE F* at(int64_t b) const {
    if (columns == nullptr) return base + b * stride;
    return base + (b % bags_per_feature) * stride + columns[b / bags_per_feature];
  }
};

/// The slot of each index of a batch: slots[i] (per index), or, with `inverse`,
/// slots[inverse[i]] (slots per distinct key, inverse mapping each index to its
/// key): the lookup's own output, read without a per-index copy of it.
struct IndexSlots {
  const int64_t* slots;
  const int64_t* inverse;  // null: slots is per index

  DYNEMB_HD DYNEMB_INLINE int64_t operator[](int64_t i) const {
    return inverse == nullptr ? slots[i] : slots[inverse[i]];
  }
};

/// A dense (num_bags, dim) matrix.
template <class F>
DYNEMB_HD DYNEMB_INLINE BagRows<F> dense_bags(F* base, int64_t dim) {
  return BagRows<F>{base, dim, nullptr, 1};
}

/// Element j of the row the `missing` initializer gives key (of its column slice).
DYNEMB_HD DYNEMB_INLINE float missing_element(const InitArgs& a, int64_t key, int64_t j) {
  return init_element(a, stream_of(a.seed, key), key, a.column_offset + j);
}

/// out (dim floats) = the pooled bag [begin, end).
template <typename V>
DYNEMB_HD void pool_bag(const TableRef<V>& t, IndexSlots slots, const int64_t* keys,
                        const float* weights, int64_t begin, int64_t end, PoolingMode mode,
                        const InitArgs& missing, float* out, int64_t dim) {
  for (int64_t j = 0; j < dim; ++j) out[j] = 0.0f;
  for (int64_t i = begin; i < end; ++i) {
    const float w = weights ? weights[i] : 1.0f;
    const int64_t slot = slots[i];
    if (slot >= 0) {
      const V* row = t.row(slot);
      for (int64_t j = 0; j < dim; ++j) out[j] = fmaf(w, static_cast<float>(row[j]), out[j]);
    } else {
      for (int64_t j = 0; j < dim; ++j) out[j] = fmaf(w, missing_element(missing, keys[i], j), out[j]);
    }
  }
  if (mode == PoolingMode::kMean && end > begin) {
    const float inv = 1.0f / static_cast<float>(end - begin);
    for (int64_t j = 0; j < dim; ++j) out[j] *= inv;
  }
}

/// Element j of pool_bag's out: the same terms, added in the same order, so the same
/// bits. GPU kernels give each element of a bag its own lane, so that the lanes of a
/// warp read consecutive elements of each row (coalesced loads).
template <typename V>
DYNEMB_HD DYNEMB_INLINE float pool_bag_element(const TableRef<V>& t, IndexSlots slots,
                                               const int64_t* keys, const float* weights,
                                               int64_t begin, int64_t end, PoolingMode mode,
                                               const InitArgs& missing, int64_t j) {
  float acc = 0.0f;
  for (int64_t i = begin; i < end; ++i) {
    const float w = weights ? weights[i] : 1.0f;
    const int64_t slot = slots[i];
    const float x = slot >= 0 ? static_cast<float>(t.row(slot)[j])
                              : missing_element(missing, keys[i], j);
    acc = fmaf(w, x, acc);
  }
  if (mode == PoolingMode::kMean && end > begin) acc *= 1.0f / static_cast<float>(end - begin);
  return acc;
}

/// Element j of gather_row's out.
template <typename V>
DYNEMB_HD DYNEMB_INLINE float gather_element(const TableRef<V>& t, const int64_t* slots,
                                             const int64_t* keys, int64_t i,
                                             const InitArgs& missing, int64_t j) {
  return slots[i] >= 0 ? static_cast<float>(t.row(slots[i])[j])
                       : missing_element(missing, keys[i], j);
}

/// out (dim floats) = the row of index i (sequence lookup).
template <typename V>
DYNEMB_HD DYNEMB_INLINE void gather_row(const TableRef<V>& t, const int64_t* slots,
                                        const int64_t* keys, int64_t i, const InitArgs& missing,
                                        float* out, int64_t dim) {
  if (slots[i] >= 0) {
    const V* row = t.row(slots[i]);
    for (int64_t j = 0; j < dim; ++j) out[j] = static_cast<float>(row[j]);
  } else {
    for (int64_t j = 0; j < dim; ++j) out[j] = missing_element(missing, keys[i], j);
  }
}

/// The gradient of a distinct key is the sum of the terms grad_scale(i) * grad_out[bag
/// of i] of its indices i, in ascending order of i, cut into chunks of kGradientChunk
/// terms: each chunk is summed from zero, term after term (add_gradient), and the
/// chunks' sums are added in order to a total that starts at zero (add_chunk). A key
/// of at most kGradientChunk indices is its one chunk's sum (0 + s is s: a sum that
/// starts at +0 is never -0). Every executor keeps this order (no float atomics), so
/// the sums, and the optimizer updates after them, are the same bits everywhere; the
/// chunks let a GPU sum a hot key's thousands of indices in parallel.
constexpr int64_t kGradientChunk = 64;

/// The chunks of a key of n indices (0 for none).
DYNEMB_HD DYNEMB_INLINE int64_t gradient_chunks(int64_t n) {
  return (n + kGradientChunk - 1) / kGradientChunk;
}

DYNEMB_HD DYNEMB_INLINE void add_gradient(float* acc, float scale, const float* grad_out,
                                          int64_t dim) {
  for (int64_t j = 0; j < dim; ++j) acc[j] += scale * grad_out[j];
}

/// total += a chunk's sum (the second level of the gradient's order, above).
DYNEMB_HD DYNEMB_INLINE void add_chunk(float* total, const float* chunk, int64_t dim) {
  for (int64_t j = 0; j < dim; ++j) total[j] += chunk[j];
}

/// Coefficient of grad_out[b] in the gradient of index i of bag [begin, end).
DYNEMB_HD DYNEMB_INLINE float grad_scale(PoolingMode mode, const float* weights, int64_t i,
                                         int64_t begin, int64_t end) {
  const float w = weights ? weights[i] : 1.0f;
  return mode == PoolingMode::kMean ? w / static_cast<float>(end - begin) : w;
}

}  // namespace dynemb
