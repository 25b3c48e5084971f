// dynemb core: a rehash (every entry of one table moved into another, as a growth
// does), run by tiles of lanes: a GPU's, or the CPU executor's one-lane SerialTile.
//
// Two passes, as an upsert's (table_ops.h "Batch rule"): pass 1, a tile per
// destination home-bucket range, its entries in source-slot order, places each in its
// home bucket (which the tile owns: the destination is written by no one else); pass 2,
// one tile, places what did not fit in its second bucket, in source-slot order (it owns
// the table). The free slot is tile_free_slot's, whatever the tile's size, so every
// entry lands in the same slot on every executor. tile_claim claims it (the slot's key and
// digest by the one lane whose scan read them: no sync before), lane 0 sets overflow flags
// (which no lane reads meanwhile), lanes copy the row in 16-byte chunks, and the tile
// syncs after each entry (the next entry's scan must see the claim).
#pragma once

#include "core/batch_sinks.h"
#include "core/bucket_tile.h"
#include "core/tile_ops.h"
#include "core/tile_room.h"

namespace dynemb {

/// Entries a rehash's pass 1 puts in a home bucket: all it holds where keys have no
/// second bucket (window 1), else 7/8 of it, the rest left to pass 2, which puts each in
/// the emptier of its two buckets. Filled home first, a table grown by 1.3x held
/// bucket fills spread as a Poisson law's (~92 +- 10 of 128), with full buckets in the
/// tail; a pair of them within 16 buckets made an insert fail right after the growth,
/// at a load of 0.74.
template <class V>
DYNEMB_HD DYNEMB_INLINE int64_t rehash_home_limit(const TableRef<V>& t, int window) {
  return window > 1 ? t.bucket_capacity - t.bucket_capacity / 8 : t.bucket_capacity;
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

/// Pass 1 of a rehash, by a tile that owns the entry's home bucket: places the entry of
/// slot `s` of `src`, whose key is absent from `t`, with its row, in its home bucket
/// while it holds fewer than rehash_home_limit entries.
/// @return the slot, or -1 (nothing changed: tile_place_moved places it in pass 2), in
/// every lane.
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

/// Pass 2 of a rehash, by its one tile: places the entry of slot `s` of `src`, whose
/// key is absent from `t` (a rehash moves each key once), with its row: in the emptier
/// of its home and (`window` 2) second bucket (ties: home), else the other (a key in
/// its second bucket flags its home), else in a slot made free in its home or then its
/// second bucket by moving one of their entries to its other bucket (tile_room_in).
/// Lane 0 writes the overflow flag; claims and moves write as tile_claim_moved and
/// tile_move_for_room do (a move after a sync: every lane read the digests and keys).
/// @return the slot, or -1 when no room was found, in every lane.
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
    tile_move_for_room(tile, t, m);
    tile_claim_moved(tile, t, src, s, m.from, digest_of(h));
    if (b != home && tile.rank() == 0) t.set_overflowed(home);
    slot = m.from;
  }
  tile.sync();  // the next entry's scan sees the claim and the flags
  return slot;
}

}  // namespace dynemb
