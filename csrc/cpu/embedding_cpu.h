// dynemb CPU executor: embedding lookups and fused backward over table slots.
#pragma once

#include <cstdint>

#include "core/batch_sinks.h"
#include "core/optimizer_rules.h"
#include "core/pooling.h"
#include "core/table_ops.h"

namespace dynemb::cpu {

/// Finds or inserts keys, recording each key's slot (-1 when it could not be stored).
template <class V>
StatusCounts find_or_insert_slots(const SlotSink<V>& sink, const UpsertArgs& args,
                                  const int64_t* keys, int64_t n, int8_t* status);

/// out (num_bags, dim) float: pooled bags (see core/pooling.h).
/// @param offsets (num_bags + 1) bag boundaries into slots/keys/weights
template <class V>
void pool(const TableRef<V>& t, const int64_t* slots, const int64_t* keys,
          const int64_t* offsets, int64_t num_bags, const float* weights, PoolingMode mode,
          const InitArgs& missing, float* out, int64_t dim);

/// out (n, dim) float: the row of each index.
template <class V>
void gather(const TableRef<V>& t, const int64_t* slots, const int64_t* keys, int64_t n,
            const InitArgs& missing, float* out, int64_t dim);

/// Reduces the gradient of every index to one gradient per distinct slot and
/// applies the optimizer to those rows in place. Indices with slot -1 are skipped.
/// @param grad        (num_bags, dim) float, d loss / d pooled bag
/// @param uid_scratch (num_slots) int32, all -1 on entry and on exit
/// @return the number of rows updated
template <class V>
int64_t backward_update(const TableRef<V>& t, const int64_t* slots, const int64_t* offsets,
                        int64_t num_bags, const float* weights, PoolingMode mode,
                        const float* grad, int64_t dim, const OptimizerArgs& opt,
                        int32_t* uid_scratch);

}  // namespace dynemb::cpu
