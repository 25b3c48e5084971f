// dynemb CUDA executor: torch-free launchers, one per op. Every pointer is device
// memory; every launcher enqueues on `stream` and returns without synchronising.
// csrc/torch/ops_cuda.cpp (CUDA builds only) checks tensors and calls these.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/batch_sinks.h"
#include "core/table_ops.h"

namespace dynemb::cuda {

/// @param keys   (n) int64
/// @param bucket (n) int64 out
/// @param digest (n) uint8 out
void launch_hash_keys(const int64_t* keys, int64_t n, int64_t num_buckets, int64_t* bucket,
                      uint8_t* digest, cudaStream_t stream);

/// @param out   (n, out_width) rows of found keys
/// @param found (n) bool out
template <class V>
void launch_find(const TableRef<V>& t, const int64_t* keys, int64_t n, V* out, int64_t out_width,
                 bool* found, cudaStream_t stream);

/// @param slots (n) int64 out, -1 for absent keys
template <class V>
void launch_find_slots(const TableRef<V>& t, const int64_t* keys, int64_t n, int64_t* slots,
                       cudaStream_t stream);

/// @param status (n) int8 out (dynemb::Status)
/// @param counts (4) int64 out, zeroed by the launcher: keys per Status
template <class V>
void launch_find_or_insert(const FindOrInsertSink<V>& sink, const UpsertArgs& args,
                           const int64_t* keys, int64_t n, int8_t* status, int64_t* counts,
                           cudaStream_t stream);

template <class V>
void launch_assign(const AssignSink<V>& sink, const UpsertArgs& args, const int64_t* keys,
                   int64_t n, int8_t* status, int64_t* counts, cudaStream_t stream);

/// Writes saved checkpoint entries (RestoreSink); status and counts as launch_find_or_insert.
template <class V>
void launch_restore(const RestoreSink<V>& sink, const UpsertArgs& args, const int64_t* keys,
                    int64_t n, int8_t* status, int64_t* counts, cudaStream_t stream);

/// @param erased (n) bool out
template <class V>
void launch_erase(const TableRef<V>& t, const int64_t* keys, int64_t n, bool* erased,
                  cudaStream_t stream);

/// Moves every entry of src into the empty dst. @param failed (1) int64 out, zeroed here.
template <class V>
void launch_rehash(const TableRef<V>& src, const TableRef<V>& dst, int window, int64_t* failed,
                   cudaStream_t stream);

}  // namespace dynemb::cuda

#include "core/dedup.h"
#include "core/optimizer_rules.h"
#include "core/pooling.h"
#include "core/tier_ops.h"

namespace dynemb::cuda {

/// find_or_insert recording slots (SlotSink); status and counts as launch_find_or_insert.
template <class V>
void launch_find_or_insert_slots(const SlotSink<V>& sink, const UpsertArgs& args,
                                 const int64_t* keys, int64_t n, int8_t* status, int64_t* counts,
                                 cudaStream_t stream);

/// out (num_bags, dim) float: pooled bags, one thread per bag.
template <class V>
void launch_pool(const TableRef<V>& t, const int64_t* slots, const int64_t* keys,
                 const int64_t* offsets, int64_t num_bags, const float* weights, PoolingMode mode,
                 const InitArgs& missing, float* out, int64_t dim, cudaStream_t stream);

/// out (n, dim) float: one row per index.
template <class V>
void launch_gather(const TableRef<V>& t, const int64_t* slots, const int64_t* keys, int64_t n,
                   const InitArgs& missing, float* out, int64_t dim, cudaStream_t stream);

/// A cache fill's row moves (core/tier_ops.h), one thread per missed key.
template <class V>
void launch_cache_exchange(const TableRef<V>& cache, const TableRef<V>& slow,
                           const CacheExchange<V>& x, cudaStream_t stream);

/// Flags each claim status (n): moved[i] = core moves_in, evicted[i] = core
/// evicts_resident (the op compacts them with tensor ops).
void launch_cache_move_flags(const int8_t* status, int64_t n, bool* moved, bool* evicted,
                             cudaStream_t stream);

/// De-duplicates keys (core/dedup.h) with one thread per key.
/// @param cell_keys (capacity) int64 and cell_uids (capacity) int32 set to -1: the
///        set's memory, capacity a power of two >= 2n; num_unique (1) int32 zeroed here.
void launch_dedup(const int64_t* keys, int64_t n, int64_t* cell_keys, int32_t* cell_uids,
                  int64_t capacity, int32_t* num_unique, int64_t* unique, int64_t* inverse,
                  int64_t* counts, cudaStream_t stream);

/// Reduces gradients to one per distinct key (atomics into acc (num_unique, dim),
/// zeroed here) and applies the optimizer to the rows of unique_slots.
template <class V>
void launch_backward(const TableRef<V>& t, const int64_t* unique_slots, int64_t num_unique,
                     const int64_t* inverse, const int64_t* offsets, int64_t num_bags,
                     const float* weights, PoolingMode mode, const float* grad, int64_t dim,
                     const OptimizerArgs& opt, float* acc, cudaStream_t stream);

}  // namespace dynemb::cuda
