// dynemb CPU executor: embedding lookups and fused backward over table slots.
#pragma once

#include <cstdint>

#include "core/batch_sinks.h"
#include "core/grouped.h"
#include "core/optimizer_rules.h"
#include "core/pooling.h"
#include "core/table_ops.h"

namespace dynemb::cpu {

/// Pools every part's bags (core/pooling.h), each to its BagRows place; the bags of
/// all parts (numbered by core/grouped.h number_parts) are split among the threads.
template <class V>
void pool(const PoolPart<V>* parts, int64_t count, PoolingMode mode);

/// out (n, dim) float: the row of each index.
template <class V>
void gather(const TableRef<V>& t, const int64_t* slots, const int64_t* keys, int64_t n,
            const InitArgs& missing, float* out, int64_t dim);

/// For every part (numbered by core/grouped.h number_parts): reduces the gradient of
/// each index (d loss / d pooled bag, at the bag's BagRows place) to one gradient per
/// distinct key and applies the optimizer to those rows in place; keys whose slot is
/// -1 are skipped. The distinct keys of all parts are split among the threads.
template <class V>
void backward_update(const BackwardPart<V>* parts, int64_t count, PoolingMode mode,
                     const OptimizerArgs& opt);

}  // namespace dynemb::cpu
