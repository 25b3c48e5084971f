// dynemb CPU executor: de-duplicating a batch of keys (core/dedup.h).
#pragma once

#include <cstdint>

#include "core/dedup.h"
#include "core/grouped.h"

namespace dynemb::cpu {

/// De-duplicates keys (first-occurrence order; core/dedup.h), on the calling thread.
/// @param keys    (n) the batch
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

}  // namespace dynemb::cpu
