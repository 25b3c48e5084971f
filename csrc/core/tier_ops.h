// dynemb core: the per-key steps of a cache fill (dynemb/tiering/cached_table.py).
//
// A cache tier and the slow table behind it have the same row layout. After the
// cache's slot claim has given every missed key a slot (status kInserted or
// kEvicted: moves_in), evicting residents whose rows are still in those slots, a
// fill runs for each such key
//   1. save_victim: the resident its claim evicted (if any) leaves with its key, row
//      and table score, for the caller to write back to the slow table; then
//   2. fetch_entry: the slot gets the key's entry in the slow table, its row and
//      score, or for a key the slow table lacks the initial row (a pure function of
//      (seed, key), as an uncached table would give it) and score 0.
// A key's entry under the table's strategy is one score column, or two for the
// compounds (TIMESTAMP, LFU) / (TIMESTAMP, DECAYED_LFU): (score, last-access time),
// the slow table's `scores` and `timestamps`. The cache keeps them per slot, row-major
// (user_scores[slot * score_columns + c]); victims leave with both.
// Keys are independent (each owns its slot; the slow table is only read), so step
// 1 of a key needs only to precede its own step 2. tile_exchange runs both steps by
// a tile of lanes (core/tile_ops.h): the slow table's probe by the tile, the rows by
// lanes in 16-byte chunks (initializer.h Lanes: a lane reads the victim's elements it
// later overwrites, and only those, at any alignment), the scalars by lane 0.
#pragma once

#include "core/batch_sinks.h"
#include "core/initializer.h"
#include "core/table_ops.h"
#include "core/tile_ops.h"

namespace dynemb {

/// True for a claim status whose key took a cache slot and needs its row there.
DYNEMB_HD DYNEMB_INLINE bool moves_in(int8_t status) {
  return status == static_cast<int8_t>(Status::kInserted) ||
         status == static_cast<int8_t>(Status::kEvicted);
}

/// True for a claim status whose key's slot still holds an evicted resident's row.
DYNEMB_HD DYNEMB_INLINE bool evicts_resident(int8_t status) {
  return status == static_cast<int8_t>(Status::kEvicted);
}

/// What compact_moves found over a range of claim statuses.
struct MoveCounts {
  int64_t moved = 0;         // keys that move in (moves_in)
  int64_t victims = 0;       // of those, keys that evict a resident (evicts_resident)
  int64_t without_slot = 0;  // of those, keys whose claim gave no slot (an error)
};

/// The compaction of a claim's moves, over statuses [begin, end) (n = the claim's
/// keys): for each i that moves_in, in ascending i, moved[m] = i and victim_index[m] =
/// the count of victims before it (evicts_resident), or -1; m and the victim count
/// start at m0 and v0 (what precedes begin). With moved null, only counts. One thread
/// may run the whole claim (m0 = v0 = 0), or one per chunk with prefix sums of the
/// chunks' counts as m0 and v0: the same outputs.
DYNEMB_HD inline MoveCounts compact_moves(const int8_t* status, const int64_t* slots,
                                          int64_t begin, int64_t end, int64_t m0, int64_t v0,
                                          int64_t* moved, int64_t* victim_index) {
  MoveCounts c;
  for (int64_t i = begin; i < end; ++i) {
    if (!moves_in(status[i])) continue;
    const bool victim = evicts_resident(status[i]);
    if (moved != nullptr) {
      moved[m0 + c.moved] = i;
      victim_index[m0 + c.moved] = victim ? v0 + c.victims : -1;
    }
    ++c.moved;
    c.victims += victim;
    c.without_slot += slots[i] < 0;
  }
  return c;
}

/// One fill's arguments, over the claim's per-key arrays (n keys) and the positions
/// of those that move in (`moved`, ascending: compact_moves). The
/// cache keeps a key's score columns under the table's strategy beside its own
/// eviction score, in user_scores (score_columns per cache slot).
template <class V>
struct CacheExchange {
  InitArgs init;                // the table's initializer (and seed)
  int64_t dim;                  // initialised embedding columns
  int64_t* user_scores;         // (cache slots, score_columns) table scores of the cached keys
  const int64_t* keys;          // (n) the claimed keys
  const int64_t* slots;         // (n) their cache slots
  const int64_t* evicted_keys;  // (n) the resident key i's claim evicted, where it did
  const int64_t* moved;         // (m) positions i whose status moves_in
  const int64_t* victim_index;  // (m) >= 0: index of moved[j]'s victim in the outputs
  int64_t m;
  bool* found;                  // (n) out: the slow table held the key (false: not moved)
  int64_t* victim_keys;         // (victims) out
  V* victim_rows;               // (victims, row_width) out
  int64_t* victim_scores;       // (victims, score_columns) out
  int64_t score_columns = 1;    // 1: score; 2: score, last-access time (the compounds)
  // Where the host sized m and the outputs from the claim's counts without reading the
  // device's compaction (CUDA executors), its own counts (moved, victims) bound what is
  // read and written: counts that disagreed (a caller's bug) would leave moves undone
  // or victims unsaved, but never read past the move list or write past an output.
  const int64_t* device_counts = nullptr;  // (2) moved, victims; null: m is the list's
  int64_t victim_capacity = INT64_MAX;     // rows of victim_keys / rows / scores
};

/// Whether the j-th of the x.m moves exists (device_counts above).
template <class V>
DYNEMB_HD DYNEMB_INLINE bool has_move(const CacheExchange<V>& x, int64_t j) {
  return j < x.m && (x.device_counts == nullptr || j < x.device_counts[0]);
}

/// The j-th move's victim index in the outputs, or -1 (none, or past their rows).
template <class V>
DYNEMB_HD DYNEMB_INLINE int64_t victim_of(const CacheExchange<V>& x, int64_t j) {
  const int64_t v = x.victim_index[j];
  return v < x.victim_capacity ? v : -1;
}

/// The score columns of cache slot `slot` leave with victim v.
template <class V>
DYNEMB_HD DYNEMB_INLINE void save_victim_scores(const CacheExchange<V>& x, int64_t slot,
                                                int64_t v) {
  const int64_t c = x.score_columns;
  for (int64_t k = 0; k < c; ++k) x.victim_scores[v * c + k] = x.user_scores[slot * c + k];
}

/// Cache slot `slot` takes the score columns of the slow table's slot `from` (the
/// compounds' second column: its timestamp), or zeros when from < 0.
template <class V>
DYNEMB_HD DYNEMB_INLINE void fetch_scores(const TableRef<V>& slow, const CacheExchange<V>& x,
                                          int64_t slot, int64_t from) {
  int64_t* out = x.user_scores + slot * x.score_columns;
  out[0] = from >= 0 && slow.has_scores() ? static_cast<int64_t>(slow.score(from)) : 0;
  if (x.score_columns > 1) {
    out[1] = from >= 0 && slow.has_timestamps() ? static_cast<int64_t>(slow.timestamp(from)) : 0;
  }
}

/// Step 1 for the j-th moved key.
template <class V>
DYNEMB_HD DYNEMB_INLINE void save_victim(const TableRef<V>& cache, const CacheExchange<V>& x,
                                         int64_t j) {
  const int64_t v = victim_of(x, j);
  if (v < 0) return;
  const int64_t i = x.moved[j];
  x.victim_keys[v] = x.evicted_keys[i];
  copy_row(cache.row(x.slots[i]), x.victim_rows + v * cache.row_width, cache.row_width);
  save_victim_scores(x, x.slots[i], v);
}

/// Step 2 for the j-th moved key; `hint` is a likely slot of it in `slow` (or -1).
template <class V>
DYNEMB_HD DYNEMB_INLINE void fetch_entry(const TableRef<V>& cache, const TableRef<V>& slow,
                                         const CacheExchange<V>& x, int64_t j, int64_t hint) {
  const int64_t i = x.moved[j];
  const int64_t key = x.keys[i];
  const int64_t slot = x.slots[i];
  V* row = cache.row(slot);
  const int64_t from = find_slot_hinted(slow, key, hint);
  x.found[i] = from >= 0;
  if (from >= 0) {
    copy_row(slow.row(from), row, cache.row_width);
  } else {
    init_row(x.init, key, row, x.dim, cache.row_width);
  }
  fetch_scores(slow, x, slot, from);
}

/// save_victim, then fetch_entry, for the j-th moved key by a tile of lanes (the same
/// writes: the slow table probed by tile_find_slot, no hint).
template <class Tile, class V>
DYNEMB_HD void tile_exchange(const Tile& tile, const TableRef<V>& cache, const TableRef<V>& slow,
                             const CacheExchange<V>& x, int64_t j) {
  const Lanes l = lanes_of(tile);
  const int64_t i = x.moved[j];
  const int64_t key = x.keys[i];
  const int64_t slot = x.slots[i];
  const int64_t width = cache.row_width;
  V* row = cache.row(slot);
  const int64_t v = victim_of(x, j);
  if (v >= 0) {
    if (l.lead()) {
      x.victim_keys[v] = x.evicted_keys[i];
      save_victim_scores(x, slot, v);
    }
    copy_row(row, x.victim_rows + v * width, width, l);
  }
  const int64_t from = tile_find_slot(tile, slow, key);
  if (from >= 0) {
    copy_row(slow.row(from), row, width, l);
  } else {
    init_row(x.init, key, row, x.dim, width, l);
  }
  if (l.lead()) {
    x.found[i] = from >= 0;
    fetch_scores(slow, x, slot, from);
  }
}

}  // namespace dynemb
