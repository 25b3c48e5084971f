// dynemb CUDA executor: torch-free launchers, one per op. Every pointer is device
// memory; every launcher enqueues on `stream` and returns without synchronising;
// temporaries come from the caller's Workspace (kernel_common.cuh).
// csrc/torch/cuda_backend.h checks tensors and calls these.
#pragma once

#include <cstdint>

#include "core/batch_sinks.h"
#include "core/dedup.h"
#include "core/grouped.h"
#include "core/optimizer_rules.h"
#include "core/pooling.h"
#include "core/table_ops.h"
#include "core/tier_ops.h"
#include "cuda/runtime.cuh"

namespace dynemb::DYNEMB_CUDA_NS {

/// Temporary device memory for a launcher, given by its caller (the torch layer takes
/// it from torch's stream-ordered caching allocator). Valid until the launcher's
/// work has run on its stream; 64-byte aligned.
class Workspace {
 public:
  virtual ~Workspace() = default;
  virtual void* bytes(int64_t n) = 0;
  template <class T>
  T* array(int64_t n) {
    return static_cast<T*>(bytes(n * static_cast<int64_t>(sizeof(T))));
  }
};

/// @param keys   (n) int64
/// @param bucket (n) int64 out
/// @param digest (n) uint8 out
void launch_hash_keys(const int64_t* keys, int64_t n, int64_t num_buckets, int64_t* bucket,
                      uint8_t* digest, cudaStream_t stream);

/// out[i] = score_for_hit(args, i, scores[i]) (core/score_policy.h)
void launch_scores_after_hit(const ScoreArgs& args, const uint64_t* scores, int64_t n,
                             uint64_t* out, cudaStream_t stream);

/// @param out   (n, out_width) rows of found keys, zeros for absent ones
/// @param found (n) bool out
template <class V>
void launch_find(const TableRef<V>& t, const int64_t* keys, int64_t n, V* out, int64_t out_width,
                 bool* found, cudaStream_t stream);

/// @param slots (n) int64 out, -1 for absent keys
template <class V>
void launch_find_slots(const TableRef<V>& t, const int64_t* keys, int64_t n, int64_t* slots,
                       cudaStream_t stream);

/// A batch upsert by core/table_ops.h's batch rule, with any Sink of core/batch_sinks.h
/// (FindOrInsertSink, AssignSink, RestoreSink, SlotSink).
/// @param live  (1) int64 device, or null: the keys upserted are the first core
///               live_keys(live, n) (a padded batch); status past them is not written
/// @param status (n) int8 out (dynemb::Status)
/// @param counts (4) int64 out, zeroed by the launcher: keys per Status
template <class Sink>
void launch_upsert_keys(const Sink& sink, const UpsertArgs& args, const int64_t* keys, int64_t n,
                        const int64_t* live, int8_t* status, int64_t* counts, Workspace& ws,
                        cudaStream_t stream);

/// table_find_or_insert_slots of every part (core/grouped.h UpsertPart), each by the
/// batch rule on its own table, all parts in one launch per phase: grouping by home
/// bucket range, pass 1, the list of deferred keys, pass 2, the status counts.
/// parts: numbered by number_parts, which gave totals.
/// @param status (totals.indices) int8 out: the parts' status arrays, one after another
template <class V>
void launch_upsert_grouped(const Parts<UpsertPart<V>>& parts, const PartTotals& totals,
                           int8_t* status, Workspace& ws, cudaStream_t stream);

/// @param erased (n) bool out
template <class V>
void launch_erase(const TableRef<V>& t, const int64_t* keys, int64_t n, bool* erased,
                  Workspace& ws, cudaStream_t stream);

/// Moves every entry of src into the empty dst. @param failed (1) int64 out.
template <class V>
void launch_rehash(const TableRef<V>& src, const TableRef<V>& dst, int window, int64_t* failed,
                   Workspace& ws, cudaStream_t stream);

/// Every part's pooled bags to their BagRows places (device memory): one launch, a
/// thread per bag of the batch. parts: numbered by number_parts, which gave totals.
template <class V>
void launch_pool(const Parts<PoolPart<V>>& parts, const PartTotals& totals, PoolingMode mode,
                 cudaStream_t stream);

/// out (n, dim) float: one row per index.
template <class V>
void launch_gather(const TableRef<V>& t, const int64_t* slots, const int64_t* keys, int64_t n,
                   const InitArgs& missing, float* out, int64_t dim, cudaStream_t stream);

/// A cache fill's row moves (core/tier_ops.h), one thread per moved key.
template <class V>
void launch_cache_exchange(const TableRef<V>& cache, const TableRef<V>& slow,
                           const CacheExchange<V>& x, cudaStream_t stream);

/// core compact_moves over a claim's status (n) and slots (n), a thread per chunk.
/// @param moved, victim_index (n) out: the first totals[0] entries are written
/// @param totals (3) int64 out: moved, victims, moved keys without a slot
void launch_cache_moves(const int8_t* status, const int64_t* slots, int64_t n, int64_t* moved,
                        int64_t* victim_index, int64_t* totals, Workspace& ws,
                        cudaStream_t stream);

/// De-duplicates each part's keys by core/dedup.h's rule (uids in first-occurrence
/// order), all parts in one launch per phase (core/grouped.h DedupPart).
/// @param unique, inverse, counts (totals.indices) int64 out, a range per part
/// @param num_unique (parts.count) int64 out: U of each part
void launch_dedup(const Parts<DedupPart>& parts, const PartTotals& totals, int64_t* unique,
                  int64_t* inverse, int64_t* counts, int64_t* num_unique, Workspace& ws,
                  cudaStream_t stream);

/// For every part: reduces gradients to one per distinct key in core/pooling.h's order
/// and applies the optimizer to the rows of unique_slots (-1: skipped). One launch per
/// phase over the whole batch (bags, indices, distinct keys of all parts).
template <class V>
void launch_backward(const Parts<BackwardPart<V>>& parts, const PartTotals& totals,
                     PoolingMode mode, const OptimizerArgs& opt, Workspace& ws,
                     cudaStream_t stream);

}  // namespace dynemb::DYNEMB_CUDA_NS
