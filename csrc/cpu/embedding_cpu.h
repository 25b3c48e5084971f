// dynemb CPU executor: embedding lookups and fused backward over table slots.
#pragma once

#include <cstdint>

#include "core/batch_sinks.h"
#include "core/dedup.h"
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

/// De-duplicates keys (first-occurrence order; core/dedup.h).
/// @param unique  (n) out: the distinct keys first; @return their number U
/// @param inverse (n) out: uid of each key, unique[inverse[i]] == keys[i]
/// @param counts  (n) out: occurrences of each distinct key (first U entries)
int64_t dedup(const int64_t* keys, int64_t n, int64_t* unique, int64_t* inverse,
              int64_t* counts);

/// dedup of every part (core/grouped.h DedupPart: its outputs at [index_begin,
/// index_begin + n) of unique, inverse, counts), the parts split among the threads.
/// @param num_unique (count) out: U of each part
void dedup(const DedupPart* parts, int64_t count, int64_t* unique, int64_t* inverse,
           int64_t* counts, int64_t* num_unique);

/// For every part (numbered by core/grouped.h number_parts): reduces the gradient of
/// each index (d loss / d pooled bag, at the bag's BagRows place) to one gradient per
/// distinct key and applies the optimizer to those rows in place; keys whose slot is
/// -1 are skipped. The distinct keys of all parts are split among the threads.
template <class V>
void backward_update(const BackwardPart<V>* parts, int64_t count, PoolingMode mode,
                     const OptimizerArgs& opt);

}  // namespace dynemb::cpu
