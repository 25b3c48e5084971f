// dynemb core: a rehash (table_ops.h place_home, place_moved) run by tiles of lanes.
//
// The same two passes as the serial rehash: pass 1, a tile per destination
// home-bucket range, its entries in source-slot order, places each in its home
// bucket (which the tile owns: the destination is written by no one else); pass 2,
// one tile, places what did not fit along its window, in source-slot order (it owns
// the table). The free slot is tile_free_slot's (bucket_free_slot's answer), so every
// entry lands where the serial rehash puts it. tile_claim claims it (the slot's key and
// digest by the one lane whose scan read them: no sync before), lane 0 sets overflow flags
// (which no lane reads meanwhile), lanes copy the row in 16-byte chunks, and the tile
// syncs after each entry (the next entry's scan must see the claim).
#pragma once

#include "core/batch_sinks.h"
#include "core/bucket_tile.h"
#include "core/tile_ops.h"

namespace dynemb {

/// Moves the entry of slot `s` of `src` (its key absent from `t`) into the first free
/// slot of `window` buckets of `t` from its home bucket on, the row included; with
/// `flag_full`, each full bucket passed gets its overflow flag (place_moved), without
/// it nothing changes when none is free (place_home, window 1).
/// @return the slot, or -1, in every lane.
template <class Tile, class V>
DYNEMB_HD int64_t tile_move_entry(const Tile& tile, const TableRef<V>& t, const TableRef<V>& src,
                                  int64_t s, int window, bool flag_full) {
  const uint64_t h = hash_key(src.key(s));
  const ProbeOrder order(h, t.bucket_capacity);
  int64_t b = bucket_of(h, t.num_buckets);
  int64_t slot = -1;
  for (int k = 0; k < window && slot < 0; ++k) {
    slot = tile_free_slot(tile, t, b, order);  // every lane agrees
    if (slot >= 0) {
      tile_claim(tile, t, slot, src.key(s), digest_of(h), src.has_scores() ? src.score(s) : 0,
                 src.has_timestamps() ? src.timestamp(s) : 0, src.has_pins() ? src.pin(s) : 0);
      copy_row(src.row(s), t.row(slot), src.row_width, lanes_of(tile));
    } else {
      if (flag_full && tile.rank() == 0) t.set_overflowed(b);
      b = t.next_bucket(b);
    }
  }
  tile.sync();  // the next entry's scan sees the claim and the flags
  return slot;
}

/// place_home and the row copy, by a tile that owns the entry's home bucket (pass 1).
template <class Tile, class V>
DYNEMB_HD DYNEMB_INLINE int64_t tile_place_home(const Tile& tile, const TableRef<V>& t,
                                                const TableRef<V>& src, int64_t s) {
  return tile_move_entry(tile, t, src, s, 1, false);
}

/// place_moved and the row copy, by the one tile of pass 2.
template <class Tile, class V>
DYNEMB_HD DYNEMB_INLINE int64_t tile_place_moved(const Tile& tile, const TableRef<V>& t,
                                                 const TableRef<V>& src, int64_t s, int window) {
  return tile_move_entry(tile, t, src, s, window, true);
}

}  // namespace dynemb
