// dynemb CPU executor: embedding lookups and fused backward over table slots.
#pragma once

#include <cstdint>

#include "core/batch_sinks.h"
#include "core/optimizer_rules.h"
#include "core/pooling.h"
#include "core/table_ops.h"

namespace dynemb::cpu {

/// out: the pooled bags (see core/pooling.h), each at its BagRows place.
/// @param offsets (num_bags + 1) bag boundaries into slots/keys/weights
template <class V>
void pool(const TableRef<V>& t, const int64_t* slots, const int64_t* keys,
          const int64_t* offsets, int64_t num_bags, const float* weights, PoolingMode mode,
          const InitArgs& missing, const BagRows<float>& out, int64_t dim);

/// out (n, dim) float: the row of each index.
template <class V>
void gather(const TableRef<V>& t, const int64_t* slots, const int64_t* keys, int64_t n,
            const InitArgs& missing, float* out, int64_t dim);

/// Reduces the gradient of every index to one gradient per distinct key and
/// applies the optimizer to those rows in place; keys whose slot is -1 are skipped.
/// @param unique_slots (num_unique) slot of each distinct key
/// @param inverse      (n) distinct-key id of each index
/// @param grad         d loss / d pooled bag, each bag's dim floats at its BagRows place
template <class V>
void backward_update(const TableRef<V>& t, const int64_t* unique_slots, int64_t num_unique,
                     const int64_t* inverse, const int64_t* offsets, int64_t num_bags,
                     const float* weights, PoolingMode mode, const BagRows<const float>& grad,
                     int64_t dim,
                     const OptimizerArgs& opt);

}  // namespace dynemb::cpu
