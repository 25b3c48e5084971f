// dynemb CPU executor: batch loops over the core per-key algorithm.
//
// Mutating batches keep core/table_ops.h's batch rule. Pass 1 is partitioned by
// home-bucket range: with T threads, thread p processes, in batch order, exactly the
// keys whose home bucket lies in the p-th range, without locks (pass 1 touches home
// buckets only); pass 2 (NO_EVICTION spills) runs on one thread in batch order. The
// result (which keys are evicted or refused, which duplicate inserts first) is the
// same whatever the thread count, and the same as the CUDA executor's. Read-only
// batches are split evenly.
#pragma once

#include <cstdint>

#include "core/batch_sinks.h"
#include "core/table_ops.h"
#include "core/tier_ops.h"

namespace dynemb::cpu {

/// @param keys   (n) int64
/// @param bucket (n) int64 out
/// @param digest (n) uint8 out
void hash_keys(const int64_t* keys, int64_t n, int64_t num_buckets, int64_t* bucket,
               uint8_t* digest);

/// out[i] = score_for_hit(args, i, scores[i]) (core/score_policy.h).
void scores_after_hit(const ScoreArgs& args, const uint64_t* scores, int64_t n, uint64_t* out);

/// Gathers the first out_width columns of each key's row; absent keys get a
/// zero row and found[i] = false.
template <class V>
void find(const TableRef<V>& t, const int64_t* keys, int64_t n, V* out, int64_t out_width,
          bool* found);

/// slots[i] = slot of keys[i] or -1.
template <class V>
void find_slots(const TableRef<V>& t, const int64_t* keys, int64_t n, int64_t* slots);

/// Upserts keys[0..n) with any Sink of core/batch_sinks.h (FindOrInsertSink,
/// AssignSink, SlotSink; the sink carries the table), partitioned by bucket range.
/// @param status (n) int8 out (dynemb::Status)
template <class Sink>
StatusCounts upsert_keys(const Sink& sink, const UpsertArgs& args, const int64_t* keys, int64_t n,
                         int8_t* status);

/// erased[i] = keys[i] was stored (and is now gone).
template <class V>
void erase(const TableRef<V>& t, const int64_t* keys, int64_t n, bool* erased);

/// A cache fill's row moves (core/tier_ops.h save_victim, fetch_entry) for every missed key.
template <class V>
void cache_exchange(const TableRef<V>& cache, const TableRef<V>& slow, const CacheExchange<V>& x);

/// Moves every entry of src into dst (an empty table). @return entries that did not fit.
template <class V>
int64_t rehash(const TableRef<V>& src, const TableRef<V>& dst, int window);

}  // namespace dynemb::cpu
