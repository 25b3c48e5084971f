// dynemb core: room in a full pair of buckets, made by moving one resident to its
// other bucket (its second when it sits at home, else its home). A one-step cuckoo
// move, for the passes that own the whole table: a rehash's pass 2 (tile_rehash.h
// tile_place_moved) and a restore's pass 2 (tile_ops.h tile_upsert_spill with a sink
// that lets residents move: moves_residents). Two choices placed by fills as a batch
// starts leave some keys whose two buckets are both full while a neighbour has room; a
// table saved near its max capacity holds such keys in the buckets their history gave
// them, which a restore from a checkpoint (no slots kept) must find room for again.
#pragma once

#include "core/bucket_tile.h"
#include "core/table_ops.h"

namespace dynemb {

/// Claims `slot` of `dst` for the entry of slot `s` of `src` (`dst` itself for a move
/// within a table), with its score, timestamp and pin; the caller copies the row.
template <class V>
DYNEMB_HD DYNEMB_INLINE void claim_moved(const TableRef<V>& dst, int64_t slot,
                                         const TableRef<V>& src, int64_t s, uint8_t digest) {
  claim(dst, slot, src.key(s), digest, src.has_scores() ? src.score(s) : 0,
        src.has_timestamps() ? src.timestamp(s) : 0, src.has_pins() ? src.pin(s) : 0);
}

/// A move that frees a slot of a full bucket: the entry of slot `from` goes to the
/// free slot `to` of its other bucket.
struct RoomMove {
  int64_t from;  // -1: no entry of the bucket has room in its other bucket
  int64_t to;
};

/// The other bucket of the entry at `slot` of bucket `b` (its second when b is its
/// home, else its home).
template <class V>
DYNEMB_HD DYNEMB_INLINE int64_t other_bucket(const TableRef<V>& t, int64_t slot, int64_t b) {
  const uint64_t h = hash_key(t.key(slot));
  const int64_t home = bucket_of(h, t.num_buckets);
  return home == b ? second_bucket_of(h, t.num_buckets) : home;
}

/// Applies a RoomMove's metadata: the entry's key, digest, score, timestamp and pin go
/// to m.to (its home's overflow flag set when that is its second bucket) and m.from is
/// left empty, for the caller to claim at once (so its bucket gets no kHoled: bucket.h
/// "Holes"). The caller moves the row (before m.from's row is overwritten).
template <class V>
DYNEMB_HD DYNEMB_INLINE void move_for_room(const TableRef<V>& t, const RoomMove& m) {
  claim_moved(t, m.to, t, m.from, t.digest(m.from));
  const int64_t home = bucket_of(hash_key(t.key(m.from)), t.num_buckets);
  if (home != m.to / t.bucket_capacity) t.set_overflowed(home);
  t.set_digest(m.from, kEmptyDigest);
}

/// Bit of bucket `y` in a mask of the buckets next to bucket `b` (those within
/// kSecondBucketSpan of it, where the other bucket of each resident of `b` lies): bits
/// 0 .. 2 * kSecondBucketSpan, one per bucket (distinct buckets, distinct bits).
template <class V>
DYNEMB_HD DYNEMB_INLINE uint64_t near_bit(const TableRef<V>& t, int64_t b, int64_t y) {
  int64_t d = y - b + kSecondBucketSpan;  // in (-num_buckets, num_buckets + span]
  if (d < 0) d += t.num_buckets;
  if (d >= t.num_buckets) d -= t.num_buckets;
  return uint64_t{1} << d;
}

/// For a pass that owns the table, when a key finds both its buckets full:
/// the first entry of full bucket `b`, in slot order, whose other bucket has a free
/// slot (tile_free_slot, in that entry's probe order). Reads only; a bucket found full
/// is not scanned again (at most 2 * kSecondBucketSpan + 1 scans, not one a resident).
/// @return the same in every lane.
template <class Tile, class V>
DYNEMB_HD RoomMove tile_room_in(const Tile& tile, const TableRef<V>& t, int64_t b) {
  const int64_t base = b * t.bucket_capacity;
  uint64_t full = 0;  // near_bit of the other buckets found full
  for (int64_t s = base; s < base + t.bucket_capacity; ++s) {
    const int64_t other = other_bucket(t, s, b);
    const uint64_t bit = near_bit(t, b, other);
    if (full & bit) continue;
    const int64_t to =
        tile_free_slot(tile, t, other, ProbeOrder(hash_key(t.key(s)), t.bucket_capacity));
    if (to >= 0) return {s, to};
    full |= bit;
  }
  return {-1, -1};
}

/// Whether any bucket within reach of a move chain from `home` and `second` (a key's two
/// buckets, both full) has a free slot: a resident of bucket X moves to its other
/// bucket, within kSecondBucketSpan of X, so two moves reach 2 * kSecondBucketSpan
/// buckets either side. When none has, no chain finds room: the caller skips the search
/// (in a full table every key that fails would otherwise scan bucket_capacity^2
/// residents' buckets). Reads only. @return the same in every lane.
template <class Tile, class V>
DYNEMB_HD bool tile_room_within_reach(const Tile& tile, const TableRef<V>& t, int64_t home,
                                      int64_t second) {
  constexpr int64_t kReach = 2 * kSecondBucketSpan;
  const int64_t last = second >= home ? second : second + t.num_buckets;  // wraps past the end
  const int64_t span = last - home + 2 * kReach + 1;
  const int64_t count = span < t.num_buckets ? span : t.num_buckets;
  int64_t b = ((home - kReach) % t.num_buckets + t.num_buckets) % t.num_buckets;  // any count
  for (int64_t k = 0; k < count; ++k) {
    if (tile_free_count(tile, t, b) > 0) return true;
    b = b + 1 == t.num_buckets ? 0 : b + 1;
  }
  return false;
}

/// Two moves that free a slot of full bucket `b` when no resident of it has room in its
/// other bucket (tile_room_in gave none): `inner` makes room in the other bucket of the
/// resident at `from` (tile_room_in there), which then moves into inner.from.
struct RoomChain {
  RoomMove inner;
  int64_t from;  // -1: none found
};

/// For a pass that owns the table, when tile_room_in found no room in `b`: the first
/// entry of `b`, in slot order, whose other bucket has a resident with room in its own
/// other bucket. Reads only. @return the same in every lane.
template <class Tile, class V>
DYNEMB_HD RoomChain tile_room_chain_in(const Tile& tile, const TableRef<V>& t, int64_t b) {
  const int64_t base = b * t.bucket_capacity;
  uint64_t roomless = 0;  // near_bit of the other buckets where tile_room_in found none
  for (int64_t s = base; s < base + t.bucket_capacity; ++s) {
    const int64_t other = other_bucket(t, s, b);
    const uint64_t bit = near_bit(t, b, other);
    if (roomless & bit) continue;
    const RoomMove m = tile_room_in(tile, t, other);
    if (m.from >= 0) return {m, s};
    roomless |= bit;
  }
  return {{-1, -1}, -1};
}

}  // namespace dynemb
