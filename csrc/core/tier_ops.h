// dynemb core: the per-key steps of a cache fill (dynemb/tiering/cached_table.py).
//
// A cache tier and the slow table behind it have the same row layout. After the
// cache's slot claim has given every missed key a slot (evicting residents whose
// rows are still in those slots), a fill
//   1. saves each evicted resident's row and table score (save_victim), for the
//      caller to write back to the slow table, then
//   2. fetches each missed key's entry from the slow table into its cache slot
//      (fetch_entry): the stored row and score, or for a key the slow table lacks
//      the initial row (a pure function of (seed, key), as an uncached table
//      would give it) and score 0.
// Executors run step 1 over all victims before step 2 (a victim's slot is some
// missed key's slot); keys within a step are independent.
#pragma once

#include "core/batch_sinks.h"
#include "core/initializer.h"
#include "core/table_ops.h"

namespace dynemb {

/// One fill's arguments. The cache keeps a key's score under the table's strategy
/// beside its own eviction score, in user_scores (one per cache slot).
template <class V>
struct CacheExchange {
  InitArgs init;                // the table's initializer (and seed)
  int64_t dim;                  // initialised embedding columns
  int64_t* user_scores;         // (cache slots) table scores of the cached keys
  const int64_t* victim_slots;  // (num_victims) cache slots of the evicted residents
  int64_t num_victims;
  V* victim_rows;               // (num_victims, row_width) out
  int64_t* victim_scores;       // (num_victims) out
  const int64_t* keys;          // (n) the missed keys
  const int64_t* slots;         // (n) their cache slots
  int64_t n;
  bool* found;                  // (n) out: the slow table held the key
};

/// Step 1 for victim v: its row and table score leave the cache.
template <class V>
DYNEMB_HD DYNEMB_INLINE void save_victim(const TableRef<V>& cache, const CacheExchange<V>& x,
                                         int64_t v) {
  const int64_t slot = x.victim_slots[v];
  copy_row(cache.row(slot), x.victim_rows + v * cache.row_width, cache.row_width);
  x.victim_scores[v] = x.user_scores[slot];
}

/// Step 2 for missed key i; `hint` is a likely slot of it in `slow` (or -1).
template <class P, class V>
DYNEMB_HD DYNEMB_INLINE void fetch_entry(const TableRef<V>& cache, const TableRef<V>& slow,
                                         const CacheExchange<V>& x, int64_t i, int64_t hint) {
  const int64_t key = x.keys[i];
  const int64_t slot = x.slots[i];
  const int64_t from = find_slot_hinted<P>(slow, key, hint);
  x.found[i] = from >= 0;
  if (from >= 0) {
    copy_row(slow.row(from), cache.row(slot), cache.row_width);
    x.user_scores[slot] = slow.scores ? static_cast<int64_t>(slow.scores[from]) : 0;
  } else {
    init_row(x.init, key, cache.row(slot), x.dim, cache.row_width);
    x.user_scores[slot] = 0;
  }
}

}  // namespace dynemb
