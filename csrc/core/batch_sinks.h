// dynemb core: what batch upserts do with value rows (the Sinks of table_ops.h).
//
//   FindOrInsertSink  hit -> copy the row out; new -> initialise the row in the
//                     table, copy it out; failed -> the initial row, not stored.
//   AssignSink        hit/new -> write the caller's row into the table (a new
//                     key's extra columns are initialised first); failed -> nothing.
//   SlotSink          hit/new -> record the key's slot (a new row is initialised,
//                     or left for the caller to write: a cache fill moving rows
//                     in); failed -> slot -1. The embedding kernels read rows by slot.
//   RestoreSink       hit/new -> write a saved entry exactly: embedding columns,
//                     optimizer state, score and timestamp (a checkpoint load, a
//                     cache's write-back); failed -> nothing.
// Both can capture evicted residents (key, full row, score) at the position of
// the key that replaced them, so nothing leaves the table unreported.
//
// Each sink function also comes with a trailing Lanes argument (initializer.h): the
// same effect, written by the lanes of a tile together (core/tile_ops.h), each lane
// its elements of the rows (plain stores), the lead lane the scalar outputs.
#pragma once

#include "core/initializer.h"
#include "core/platform.h"
#include "core/table_ref.h"

namespace dynemb {

/// Keys of one upsert batch per Status (hit, inserted, evicted, failed).
struct StatusCounts {
  int64_t by_status[kStatusCount] = {0, 0, 0, 0};
};

template <class V>
DYNEMB_HD DYNEMB_INLINE void copy_row(const V* src, V* dst, int64_t n) {
  for (int64_t j = 0; j < n; ++j) dst[j] = src[j];
}

/// copy_row's chunks that lane `l` owns (initializer.h for_lane_chunks): a whole chunk
/// in one 16-byte move (platform.h move16: a vector load and store on a device), a
/// partial last one element by element.
template <class V>
DYNEMB_HD DYNEMB_INLINE void copy_row(const V* src, V* dst, int64_t n, Lanes l) {
  if (l.stride == 1) return copy_row(src, dst, n);
  for_lane_chunks<V>(n, l, [&](int64_t j, int64_t m) DYNEMB_INLINE_LAMBDA {
    if (m == row_chunk<V>()) {
      move16(src + j, dst + j);
    } else {
      for (int64_t k = j; k < j + m; ++k) dst[k] = src[k];
    }
  });
}

/// Zeroes the chunks of dst (n elements) that lane `l` owns, as copy_row moves them.
template <class V>
DYNEMB_HD DYNEMB_INLINE void zero_row(V* dst, int64_t n, Lanes l) {
  for_lane_chunks<V>(n, l, [&](int64_t j, int64_t m) DYNEMB_INLINE_LAMBDA {
    for (int64_t k = j; k < j + m; ++k) dst[k] = V(0.0f);
  });
}

/// Optional capture of evicted residents; all pointers null when not wanted, rows
/// and scores also null when only the keys are (the row stays in the slot until the
/// caller moves it: SlotSink without init_rows).
template <class V>
struct EvictedOut {
  int64_t* keys;    // (n)
  V* rows;          // (n, row_width)
  int64_t* scores;  // (n)

  DYNEMB_HD DYNEMB_INLINE void capture(const TableRef<V>& t, int64_t i, int64_t slot) const {
    if (keys == nullptr) return;
    keys[i] = t.key(slot);
    if (scores) scores[i] = t.has_scores() ? static_cast<int64_t>(t.score(slot)) : 0;
    if (rows) copy_row(t.row(slot), rows + i * t.row_width, t.row_width);
  }
  DYNEMB_HD DYNEMB_INLINE void capture(const TableRef<V>& t, int64_t i, int64_t slot,
                                       Lanes l) const {
    if (keys == nullptr) return;
    if (l.lead()) {
      keys[i] = t.key(slot);
      if (scores) scores[i] = t.has_scores() ? static_cast<int64_t>(t.score(slot)) : 0;
      if (rows) t.count_row(Access::kRowRead, slot, t.row_width * int64_t{sizeof(V)});
    }
    if (rows) copy_row(t.row(slot), rows + i * t.row_width, t.row_width, l);
  }
};

/// How a sink writes rows: plain stores. An executor may substitute its own type
/// with the same functions (the CPU one streams the rows of large batches).
struct PlainStore {
  /// Copies a row into the caller's output.
  template <class V>
  DYNEMB_HD static void row(const V* src, V* dst, int64_t n) {
    copy_row(src, dst, n);
  }
  /// Copies a caller's row (or its first n columns) into a table row.
  template <class V>
  DYNEMB_HD static void table_row(const V* src, V* dst, int64_t n) {
    copy_row(src, dst, n);
  }
  /// Initialises the table row `row` (row_width columns) of a new key and copies its
  /// first out_width columns to `out`.
  template <class V>
  DYNEMB_HD static void new_row(const InitArgs& init, int64_t key, int64_t dim, V* row,
                                int64_t row_width, V* out, int64_t out_width) {
    init_row(init, key, row, dim, row_width);
    copy_row(row, out, out_width);
  }
};

template <class V, class StoreT = PlainStore>
struct FindOrInsertSink {
  using Store = StoreT;
  static constexpr bool kRowOnHit = true;  // a hit reads the row (executors prefetch it)
  TableRef<V> t;
  InitArgs init;
  int64_t dim;        // initialised embedding columns
  V* out;             // (n, out_width)
  int64_t out_width;  // <= t.row_width
  EvictedOut<V> evicted;

  DYNEMB_HD void hit(int64_t i, int64_t, int64_t slot) {
    Store::row(t.row(slot), out + i * out_width, out_width);
  }
  DYNEMB_HD void evicting(int64_t i, int64_t slot) { evicted.capture(t, i, slot); }
  DYNEMB_HD void fresh(int64_t i, int64_t, int64_t slot, int64_t key) {
    Store::new_row(init, key, dim, t.row(slot), t.row_width, out + i * out_width, out_width);
  }
  DYNEMB_HD void failed(int64_t i, int64_t, int64_t key) {
    init_row(init, key, out + i * out_width, dim < out_width ? dim : out_width, out_width);
  }
  // By lanes (plain stores).
  DYNEMB_HD void hit(int64_t i, int64_t, int64_t slot, Lanes l) {
    if (l.lead()) t.count_row(Access::kRowRead, slot, out_width * int64_t{sizeof(V)});
    copy_row(t.row(slot), out + i * out_width, out_width, l);
  }
  DYNEMB_HD void evicting(int64_t i, int64_t slot, Lanes l) { evicted.capture(t, i, slot, l); }
  DYNEMB_HD void fresh(int64_t i, int64_t, int64_t slot, int64_t key, Lanes l) {
    V* row = t.row(slot);
    if (l.lead()) t.count_row(Access::kRowWrite, slot, t.row_width * int64_t{sizeof(V)});
    init_row(init, key, row, dim, t.row_width, l, out + i * out_width, out_width);
  }
  DYNEMB_HD void failed(int64_t i, int64_t, int64_t key, Lanes l) {
    init_row(init, key, out + i * out_width, dim < out_width ? dim : out_width, out_width, l);
  }
};

template <class V, class StoreT = PlainStore>
struct AssignSink {
  using Store = StoreT;
  static constexpr bool kRowOnHit = true;  // a hit writes the row
  TableRef<V> t;
  InitArgs init;
  int64_t dim;
  const V* in;       // (n, in_width)
  int64_t in_width;  // dim or row_width
  EvictedOut<V> evicted;

  DYNEMB_HD void hit(int64_t i, int64_t, int64_t slot) {
    Store::table_row(in + i * in_width, t.row(slot), in_width);
  }
  DYNEMB_HD void evicting(int64_t i, int64_t slot) { evicted.capture(t, i, slot); }
  DYNEMB_HD void fresh(int64_t i, int64_t o, int64_t slot, int64_t) {
    V* row = t.row(slot);
    for (int64_t j = in_width; j < t.row_width; ++j) {
      row[j] = static_cast<V>(extra_element(init, j - dim));
    }
    hit(i, o, slot);
  }
  DYNEMB_HD void failed(int64_t, int64_t, int64_t) {}
  // By lanes (plain stores).
  DYNEMB_HD void hit(int64_t i, int64_t, int64_t slot, Lanes l) {
    if (l.lead()) t.count_row(Access::kRowWrite, slot, in_width * int64_t{sizeof(V)});
    copy_row(in + i * in_width, t.row(slot), in_width, l);
  }
  DYNEMB_HD void evicting(int64_t i, int64_t slot, Lanes l) { evicted.capture(t, i, slot, l); }
  DYNEMB_HD void fresh(int64_t i, int64_t o, int64_t slot, int64_t, Lanes l) {
    V* row = t.row(slot);
    for (int64_t j = in_width + l.first; j < t.row_width; j += l.stride) {
      row[j] = static_cast<V>(extra_element(init, j - dim));
    }
    hit(i, o, slot, l);
  }
  DYNEMB_HD void failed(int64_t, int64_t, int64_t, Lanes) {}
};

template <class V>
struct SlotSink {
  static constexpr bool kRowOnHit = false;  // only new keys touch their row (init_rows)
  TableRef<V> t;
  InitArgs init;
  int64_t dim;
  int64_t* slots;  // (n), written at each key's output position o
  EvictedOut<V> evicted;
  bool init_rows;  // false: a new key's slot keeps its old row (the evicted one's) for
                   // the caller, who moves it out and writes the new row itself

  /// Writes the initial row of `key` into `slot` (what fresh does under init_rows).
  DYNEMB_HD void write_new_row(int64_t slot, int64_t key) const {
    init_row(init, key, t.row(slot), dim, t.row_width);
  }
  DYNEMB_HD void hit(int64_t, int64_t o, int64_t slot) { slots[o] = slot; }
  DYNEMB_HD void evicting(int64_t i, int64_t slot) { evicted.capture(t, i, slot); }
  DYNEMB_HD void fresh(int64_t, int64_t o, int64_t slot, int64_t key) {
    if (init_rows) write_new_row(slot, key);
    slots[o] = slot;
  }
  DYNEMB_HD void failed(int64_t, int64_t o, int64_t) { slots[o] = -1; }
  // By lanes.
  DYNEMB_HD void hit(int64_t, int64_t o, int64_t slot, Lanes l) {
    if (l.lead()) slots[o] = slot;
  }
  DYNEMB_HD void evicting(int64_t i, int64_t slot, Lanes l) { evicted.capture(t, i, slot, l); }
  DYNEMB_HD void fresh(int64_t, int64_t o, int64_t slot, int64_t key, Lanes l) {
    if (init_rows && l.lead()) {
      t.count_row(Access::kRowWrite, slot, t.row_width * int64_t{sizeof(V)});
    }
    if (init_rows) init_row(init, key, t.row(slot), dim, t.row_width, l);
    if (l.lead()) slots[o] = slot;
  }
  DYNEMB_HD void failed(int64_t, int64_t o, int64_t, Lanes l) {
    if (l.lead()) slots[o] = -1;
  }
};

/// A checkpoint's entry i, in separate arrays as the files hold them (no row concat).
template <class V>
struct SavedEntries {
  const V* values;             // (n, dim)
  const V* state;              // (n, state_width), or null: state columns get extra_element
  int64_t state_width;         // 0 or row_width - dim
  const int64_t* scores;       // (n), or null: the strategy's score stays
  const int64_t* timestamps;   // (n), or null: the batch value stays
};

/// Writes saved entries over whatever upsert stored: the score and timestamp the
/// strategy gave a new or hit key are replaced by the saved ones in the same bucket
/// critical section, so a restored entry is never visible half-written.
template <class V>
struct RestoreSink {
  static constexpr bool kRowOnHit = true;  // a hit overwrites the row
  // Reports no slot: pass 2 may move a resident to make room (tile_ops.h moves_residents).
  static constexpr bool kMovesResidents = true;
  TableRef<V> t;
  InitArgs init;
  int64_t dim;
  SavedEntries<V> in;
  EvictedOut<V> evicted;

  DYNEMB_HD DYNEMB_INLINE void hit(int64_t i, int64_t, int64_t slot) {
    V* row = t.row(slot);
    copy_row(in.values + i * dim, row, dim);
    if (in.state) copy_row(in.state + i * in.state_width, row + dim, in.state_width);
    if (t.has_scores() && in.scores) t.set_score(slot, static_cast<uint64_t>(in.scores[i]));
    if (t.has_timestamps() && in.timestamps) {
      t.set_timestamp(slot, static_cast<uint64_t>(in.timestamps[i]));
    }
  }
  DYNEMB_HD void evicting(int64_t i, int64_t slot) { evicted.capture(t, i, slot); }
  DYNEMB_HD void fresh(int64_t i, int64_t o, int64_t slot, int64_t) {
    if (!in.state) {
      V* row = t.row(slot);
      for (int64_t j = dim; j < t.row_width; ++j) {
        row[j] = static_cast<V>(extra_element(init, j - dim));
      }
    }
    hit(i, o, slot);
  }
  DYNEMB_HD void failed(int64_t, int64_t, int64_t) {}
  // By lanes.
  DYNEMB_HD void hit(int64_t i, int64_t, int64_t slot, Lanes l) {
    V* row = t.row(slot);
    copy_row(in.values + i * dim, row, dim, l);
    if (in.state) copy_row(in.state + i * in.state_width, row + dim, in.state_width, l);
    if (!l.lead()) return;
    t.count_row(Access::kRowWrite, slot, t.row_width * int64_t{sizeof(V)});
    if (t.has_scores() && in.scores) t.set_score(slot, static_cast<uint64_t>(in.scores[i]));
    if (t.has_timestamps() && in.timestamps) {
      t.set_timestamp(slot, static_cast<uint64_t>(in.timestamps[i]));
    }
  }
  DYNEMB_HD void evicting(int64_t i, int64_t slot, Lanes l) { evicted.capture(t, i, slot, l); }
  DYNEMB_HD void fresh(int64_t i, int64_t o, int64_t slot, int64_t, Lanes l) {
    if (!in.state) {
      V* row = t.row(slot);
      for (int64_t j = dim + l.first; j < t.row_width; j += l.stride) {
        row[j] = static_cast<V>(extra_element(init, j - dim));
      }
    }
    hit(i, o, slot, l);
  }
  DYNEMB_HD void failed(int64_t, int64_t, int64_t, Lanes) {}
};

}  // namespace dynemb
