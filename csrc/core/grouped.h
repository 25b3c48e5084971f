// dynemb core: the dedup, training lookup, pooling and backward of every table of a
// batch in one executor pass (fbgemm's table-batched shape). Each table's share is a
// part: its buffers, its keys or bags, and where they start in the batch's flat
// numbering of keys (dedup, lookup), bags (pooling) or indices and distinct keys
// (backward). A work item (a key, a bucket range, a bag, a distinct key) finds
// its part by a binary search over those starts; the per-item maths is the
// per-table one (pooling.h, optimizer_rules.h), so a grouped call writes the same
// bits as one call per table.
#pragma once

#include "core/batch_sinks.h"
#include "core/dedup.h"
#include "core/optimizer_rules.h"
#include "core/pooling.h"
#include "core/table_ops.h"

namespace dynemb {

/// One table's bags of a grouped pooling (the arguments of one embedding_pool_into).
template <class V>
struct PoolPart {
  TableRef<V> table;
  IndexSlots slots;        // slot of each index, -1: the `missing` row
  const int64_t* keys;     // (n)
  const int64_t* offsets;  // (num_bags + 1)
  const float* weights;    // (n) or null
  InitArgs missing;
  BagRows<float> out;
  int64_t num_bags;
  int64_t dim;
  int64_t bag_begin;  // its first bag in the batch's numbering (sum of earlier num_bags)
};

/// One table's share of a grouped backward (the arguments of one embedding_backward).
template <class V>
struct BackwardPart {
  TableRef<V> table;
  const int64_t* unique_slots;  // (num_unique) slot per distinct key, -1: skipped
  const int64_t* inverse;       // (num_indices) distinct-key id of each index
  const int64_t* offsets;       // (num_bags + 1), offsets[num_bags] == num_indices
  const float* weights;         // (num_indices) or null
  BagRows<const float> grad;
  int64_t num_bags;
  int64_t num_indices;
  int64_t num_unique;
  int64_t dim;
  int64_t bag_begin;     // starts in the batch's numbering of bags, indices,
  int64_t index_begin;   // distinct keys, and gradient accumulator floats
  int64_t unique_begin;  // (sums over the earlier parts)
  int64_t acc_begin;     // (the CUDA executor's accumulators; the CPU one sums per task)
};

/// One table's keys of a grouped dedup (core/dedup.h's rule, per table). Its outputs
/// are the range [index_begin, index_begin + n) of the call's flat (total indices)
/// unique / inverse / counts arrays (the first num_unique entries of unique and counts
/// are written); its set is cells [cell_begin, cell_begin + dedup_capacity(n)) of the
/// call's cells.
struct DedupPart {
  const int64_t* keys;  // (n)
  int64_t n;
  int64_t index_begin;
  int64_t cell_begin;
};

/// Ranges of home buckets for a batch of n keys of a table of num_buckets buckets
/// (table_ops.h's batch rule lets ranges run concurrently; a range's keys run in batch
/// order): about one per key, at most one per bucket. Any count gives the same result.
DYNEMB_HD DYNEMB_INLINE int64_t bucket_range_count(int64_t n, int64_t num_buckets) {
  return n < num_buckets ? (n > 0 ? n : 1) : num_buckets;
}

/// The range of `ranges` (bucket_range_count's) that holds home bucket `bucket`:
/// contiguous runs of buckets, in bucket order.
DYNEMB_HD DYNEMB_INLINE int64_t bucket_range_of(int64_t bucket, int64_t ranges,
                                                int64_t num_buckets) {
  return static_cast<int64_t>(static_cast<uint64_t>(bucket) * static_cast<uint64_t>(ranges) /
                              static_cast<uint64_t>(num_buckets));
}

/// One table's distinct keys of a grouped training lookup (the arguments of one
/// table_find_or_insert_slots: its outputs are its slots, through the sink, and its
/// status). Its keys are [key_begin, key_begin + n) of the call's flat numbering, its
/// home-bucket ranges [range_begin, range_begin + ranges).
template <class V>
struct UpsertPart {
  SlotSink<V> sink;
  UpsertArgs args;
  const int64_t* keys;  // (n)
  int8_t* status;       // (n) out, at key_begin of the call's flat status array
  int64_t* counts;      // (kStatusCount) out: keys per Status, zeroed by the caller
  int64_t n;
  int64_t key_begin;
  int64_t range_begin;
  int64_t ranges;  // bucket_range_count(n, its table's buckets)
};

/// The parts of a call as an executor reads them: an array (device memory on a GPU),
/// or a single part held by value (one table: nothing to copy to the device).
template <class Part>
struct Parts {
  const Part* array;  // null: the one part is `one`
  Part one;
  int64_t count;

  DYNEMB_HD DYNEMB_INLINE const Part& operator[](int64_t p) const {
    return array != nullptr ? array[p] : one;
  }
};

/// The part whose range [p.*start, next part's start) holds x: the last part whose
/// start is <= x (parts are numbered in order, so empty parts are passed over).
template <class Part>
DYNEMB_HD DYNEMB_INLINE const Part& part_of(const Parts<Part>& parts, int64_t x,
                                            int64_t Part::*start) {
  int64_t lo = 0, hi = parts.count - 1;
  while (lo < hi) {
    const int64_t mid = (lo + hi + 1) / 2;
    if (parts[mid].*start <= x) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return parts[lo];
}

/// Sizes of a grouped call: the sums over its parts.
struct PartTotals {
  int64_t bags = 0;
  int64_t indices = 0;
  int64_t unique = 0;
  int64_t acc = 0;    // gradient accumulator floats (num_unique * dim per part)
  int64_t cells = 0;  // dedup set cells (dedup_capacity(n) per part)
  int64_t ranges = 0;  // home-bucket ranges (a grouped lookup)
  int64_t max_dim = 0;  // the widest part's dim (a backward)
  bool two_buckets = false;  // some part's keys may live in two buckets (a grouped lookup
                             // under NO_EVICTION): it runs pass 0 and pass 2
                             // (table_ops.h chooses_buckets, tile_upsert_owned)
};

/// Numbers the parts' keys and set cells one after another.
inline PartTotals number_parts(DedupPart* parts, int64_t count) {
  PartTotals total;
  for (int64_t p = 0; p < count; ++p) {
    parts[p].index_begin = total.indices;
    parts[p].cell_begin = total.cells;
    total.indices += parts[p].n;
    total.cells += dedup_capacity(parts[p].n);
  }
  return total;
}

/// Numbers the parts' keys (in `indices`) and home-bucket ranges one after another.
template <class V>
PartTotals number_parts(UpsertPart<V>* parts, int64_t count) {
  PartTotals total;
  for (int64_t p = 0; p < count; ++p) {
    UpsertPart<V>& q = parts[p];
    q.key_begin = total.indices;
    q.range_begin = total.ranges;
    q.ranges = bucket_range_count(q.n, q.sink.t.num_buckets);
    total.indices += q.n;
    total.ranges += q.ranges;
    total.two_buckets |= chooses_buckets(q.sink.t, q.args);
  }
  return total;
}

/// Numbers the parts' bags one after another (sets bag_begin).
template <class V>
PartTotals number_parts(PoolPart<V>* parts, int64_t count) {
  PartTotals total;
  for (int64_t p = 0; p < count; ++p) {
    parts[p].bag_begin = total.bags;
    total.bags += parts[p].num_bags;
  }
  return total;
}

/// Numbers the parts' bags, indices, distinct keys and accumulators one after another.
template <class V>
PartTotals number_parts(BackwardPart<V>* parts, int64_t count) {
  PartTotals total;
  for (int64_t p = 0; p < count; ++p) {
    BackwardPart<V>& q = parts[p];
    q.bag_begin = total.bags;
    q.index_begin = total.indices;
    q.unique_begin = total.unique;
    q.acc_begin = total.acc;
    total.bags += q.num_bags;
    total.indices += q.num_indices;
    total.unique += q.num_unique;
    total.acc += q.num_unique * q.dim;
    total.max_dim = q.dim > total.max_dim ? q.dim : total.max_dim;
  }
  return total;
}

/// Pools bag b (local to part p) to its place.
template <class V>
DYNEMB_HD DYNEMB_INLINE void pool_part_bag(const PoolPart<V>& p, PoolingMode mode, int64_t b,
                                           float* out) {
  pool_bag(p.table, p.slots, p.keys, p.weights, p.offsets[b], p.offsets[b + 1], mode, p.missing,
           out, p.dim);
}

/// Element j of bag b (local to part p), as pool_part_bag writes it.
template <class V>
DYNEMB_HD DYNEMB_INLINE float pool_part_element(const PoolPart<V>& p, PoolingMode mode,
                                                int64_t b, int64_t j) {
  return pool_bag_element(p.table, p.slots, p.keys, p.weights, p.offsets[b], p.offsets[b + 1],
                          mode, p.missing, j);
}

/// Element j of the sum of the gradient terms of part p's indices order[k0 .. k1) (in
/// the batch's numbering, ascending; one key's, at most one chunk of pooling.h's order)
/// whose bags bag_of gives (batch numbering): add_gradient's terms in its order, element
/// by element, so that threads that each sum other elements of one chunk give the bits
/// of one thread summing the row with add_gradient (the CPU executor).
template <class V>
DYNEMB_HD DYNEMB_INLINE float key_gradient_element(const BackwardPart<V>& p, PoolingMode mode,
                                                   const int64_t* order, int64_t k0, int64_t k1,
                                                   const int64_t* bag_of, int64_t j) {
  float sum = 0.0f;
  for (int64_t k = k0; k < k1; ++k) {
    const int64_t i = order[k] - p.index_begin;
    const int64_t b = bag_of[order[k]] - p.bag_begin;
    sum += grad_scale(mode, p.weights, i, p.offsets[b], p.offsets[b + 1]) * p.grad.at(b)[j];
  }
  return sum;
}

/// Element j of a key's gradient from its chunks' sums chunk[c * stride + j], c <
/// count (pooling.h's order: a total from zero, the chunks added in order).
DYNEMB_HD DYNEMB_INLINE float chunk_total_element(const float* chunk, int64_t stride,
                                                  int64_t count, int64_t j) {
  float total = 0.0f;
  for (int64_t c = 0; c < count; ++c) total += chunk[c * stride + j];
  return total;
}

/// The optimizer update of distinct key u's row by its summed gradient acc (dim floats).
template <class V>
DYNEMB_HD DYNEMB_INLINE void update_key(const BackwardPart<V>& p, const OptimizerArgs& opt,
                                        int64_t u, float* acc) {
  const int64_t slot = p.unique_slots[u];
  update_row(opt, p.table.row(slot), p.dim, acc, p.table.key(slot));
}

}  // namespace dynemb
