// dynemb core: a batch erase, run by tiles of lanes: a GPU's, or the CPU executor's
// one-lane SerialTile.
//
// Two passes, as an upsert's (table_ops.h "Batch rule"), so that neither takes a
// bucket lock: pass 1, a tile per home-bucket range, its keys in batch order, looks
// only in each key's home bucket (which the tile owns): found there, the key is
// erased; absent from a home bucket never flagged, it is not stored; else (it may
// sit in its second bucket) it is deferred. Pass 2, one tile, looks in the deferred
// keys' home and second buckets in batch order (it owns the table). The results are
// those of erasing each key in batch order: erasing one key never changes where
// another is or whether it is stored (overflow flags are never cleared), so the keys
// of different ranges commute, and a repeated key's first occurrence erases it in
// either pass.
// The erased slot's digest_lane (the one lane whose scan read its digest and key: no
// sync before) writes its digest; the tile syncs before the next key's scan.
#pragma once

#include "core/bucket_tile.h"
#include "core/table_ops.h"

namespace dynemb {

/// Empties `slot` for good (an erase): its bucket gets kHoled (bucket.h "Holes").
template <class V>
DYNEMB_HD DYNEMB_INLINE void empty_slot(const TableRef<V>& t, int64_t slot) {
  t.set_digest(slot, kEmptyDigest);
  t.set_holed(slot / t.bucket_capacity);
}

/// What pass 1 decides for a key.
enum class EraseHome : int8_t { kAbsent = 0, kErased = 1, kDeferred = 2 };

/// Pass 1 for `key`, by a tile that owns its home bucket. @return the decision, in
/// every lane (kDeferred: nothing changed).
template <class Tile, class V>
DYNEMB_HD EraseHome tile_erase_home(const Tile& tile, const TableRef<V>& t, int64_t key) {
  const KeyProbe p(t, key);
  const int64_t slot = tile_bucket_find(tile, t, p.bucket, key, p.digest, p.order.home);
  if (slot >= 0) {
    if (tile.rank() == digest_lane(tile, t, slot)) empty_slot(t, slot);
    tile.sync();
    return EraseHome::kErased;
  }
  return t.overflowed(p.bucket) ? EraseHome::kDeferred : EraseHome::kAbsent;
}

/// Removes `key` (its home bucket, then its second past a flagged home), by the one
/// tile of pass 2 (it owns the table), without locks.
/// @return true, in every lane, when the key was stored.
template <class Tile, class V>
DYNEMB_HD bool tile_erase_key(const Tile& tile, const TableRef<V>& t, int64_t key) {
  const uint64_t h = hash_key(key);
  const KeyProbe p = KeyProbe::of_hash(t, h);
  int64_t b = p.bucket;
  for (int k = 0; k < kMaxProbeBuckets; ++k) {
    const int64_t slot = tile_bucket_find(tile, t, b, key, p.digest, p.order.home);
    if (slot >= 0) {
      if (tile.rank() == digest_lane(tile, t, slot)) empty_slot(t, slot);
      tile.sync();
      return true;
    }
    b = k == 0 ? second_to_read(t, h, b) : -1;
    if (b < 0) return false;
  }
  return false;
}

}  // namespace dynemb
