// dynemb core: a rehash (table_ops.h place_home, place_moved) run by tiles of lanes.
//
// The same two passes as the serial rehash: pass 1, a tile per destination
// home-bucket range, its entries in source-slot order, places each in its home
// bucket (which the tile owns: the destination is written by no one else); pass 2,
// one tile, places what did not fit in its second bucket, in source-slot order (it owns
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

/// room_in by a tile. @return the same in every lane.
template <class Tile, class V>
DYNEMB_HD RoomMove tile_room_in(const Tile& tile, const TableRef<V>& t, int64_t b) {
  const int64_t base = b * t.bucket_capacity;
  for (int64_t s = base; s < base + t.bucket_capacity; ++s) {
    const int64_t other = other_bucket(t, s, b);
    const int64_t to =
        tile_free_slot(tile, t, other, ProbeOrder(hash_key(t.key(s)), t.bucket_capacity));
    if (to >= 0) return {s, to};
  }
  return {-1, -1};
}

/// Claims free slot `slot` of `t` for the entry of slot `s` of `src`, the row included
/// (tile_claim: no sync before).
template <class Tile, class V>
DYNEMB_HD DYNEMB_INLINE void tile_claim_moved(const Tile& tile, const TableRef<V>& t,
                                              const TableRef<V>& src, int64_t s, int64_t slot,
                                              uint8_t digest) {
  tile_claim(tile, t, slot, src.key(s), digest, src.has_scores() ? src.score(s) : 0,
             src.has_timestamps() ? src.timestamp(s) : 0, src.has_pins() ? src.pin(s) : 0);
  copy_row(src.row(s), t.row(slot), src.row_width, lanes_of(tile));
}

/// place_home and the row copy, by a tile that owns the entry's home bucket (pass 1).
/// @return the slot, or -1 (nothing changed), in every lane.
template <class Tile, class V>
DYNEMB_HD int64_t tile_place_home(const Tile& tile, const TableRef<V>& t,
                                  const TableRef<V>& src, int64_t s, int window) {
  const uint64_t h = hash_key(src.key(s));
  const int64_t home = bucket_of(h, t.num_buckets);
  int64_t slot = -1;
  if (t.bucket_capacity - tile_free_count(tile, t, home) < rehash_home_limit(t, window)) {
    slot = tile_free_slot(tile, t, home, ProbeOrder(h, t.bucket_capacity));  // lanes agree
    if (slot >= 0) tile_claim_moved(tile, t, src, s, slot, digest_of(h));
  }
  tile.sync();  // the next entry's scan sees the claim
  return slot;
}

/// place_moved and the row copy, by the one tile of pass 2: the same choices, each
/// bucket scanned by the tile; lane 0 writes the overflow flag and a move's metadata
/// after a sync (every lane read the digests and keys first), the lanes the rows.
/// @return the slot, or -1, in every lane.
template <class Tile, class V>
DYNEMB_HD int64_t tile_place_moved(const Tile& tile, const TableRef<V>& t,
                                   const TableRef<V>& src, int64_t s, int window) {
  const uint64_t h = hash_key(src.key(s));
  const ProbeOrder order(h, t.bucket_capacity);
  const int64_t home = bucket_of(h, t.num_buckets);
  const int64_t second = window > 1 && t.num_buckets > 1 ? second_bucket_of(h, t.num_buckets) : -1;
  const bool second_first =
      second >= 0 && tile_free_count(tile, t, second) > tile_free_count(tile, t, home);
  int64_t slot = -1;
  for (int k = 0; k < 2 && slot < 0; ++k) {
    const int64_t b = (k == 0) != second_first ? home : second;
    if (b < 0) continue;
    slot = tile_free_slot(tile, t, b, order);  // every lane agrees
    if (slot < 0) continue;
    tile_claim_moved(tile, t, src, s, slot, digest_of(h));
    if (b != home && tile.rank() == 0) t.set_overflowed(home);
  }
  for (int k = 0; slot < 0 && second >= 0 && k < 2; ++k) {
    const int64_t b = k == 0 ? home : second;
    const RoomMove m = tile_room_in(tile, t, b);
    if (m.from < 0) continue;
    copy_row(t.row(m.from), t.row(m.to), t.row_width, lanes_of(tile));
    tile.sync();  // every lane read the digests and keys lane 0 writes below
    if (tile.rank() == 0) {
      move_for_room(t, m);
      claim_moved(t, m.from, src, s, digest_of(h));
      if (b != home) t.set_overflowed(home);
    }
    // Each lane overwrites the chunks of the row it moved out above (Lanes).
    copy_row(src.row(s), t.row(m.from), src.row_width, lanes_of(tile));
    slot = m.from;
  }
  tile.sync();  // the next entry's scan sees the claim and the flags
  return slot;
}

}  // namespace dynemb
