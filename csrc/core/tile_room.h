// dynemb core: room in a full pair of buckets, made by moving one resident to its
// other bucket (its second when it sits at home, else its home). A one-step cuckoo
// move, for the passes that own the whole table: a rehash's pass 2 (tile_rehash.h
// tile_place_moved) and a restore's pass 2 (tile_ops.h tile_upsert_spill with a sink
// that lets residents move: moves_residents). Two choices placed by fills as a batch
// starts leave some keys whose two buckets are both full while a neighbour has room; a
// table saved near its max capacity holds such keys in the buckets their history gave
// them, which a restore from a checkpoint (no slots kept) must find room for again.
// A restore also chains such moves, two or three deep (tile_room_chain), each search
// bounded by the reach of its moves.
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
  int64_t from = -1;  // -1: no entry of the bucket has room in its other bucket
  int64_t to = -1;
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

/// Whether any bucket within reach of a chain of kMoves moves from `home` and `second` (a
/// key's two buckets, both full) has a free slot: a resident of bucket X moves to its
/// other bucket, within kSecondBucketSpan of X, so k moves reach k * kSecondBucketSpan
/// buckets either side. When none has, no such chain finds room: the caller skips the
/// search (in a full table every key that fails would otherwise scan bucket_capacity^k
/// residents' buckets). Reads only. @return the same in every lane.
template <int kMoves, class Tile, class V>
DYNEMB_HD bool tile_room_within_reach(const Tile& tile, const TableRef<V>& t, int64_t home,
                                      int64_t second) {
  constexpr int64_t kReach = kMoves * kSecondBucketSpan;
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

/// A chain of moves that frees a slot of full bucket `b` when a shorter one does not:
/// `inner` makes room in the other bucket of the resident at `from`, which then moves
/// into inner.from.
template <class Inner>
struct RoomVia {
  Inner inner{};
  int64_t from = -1;  // -1: none found
};

/// What a chain of kMoves moves is: a RoomMove, then a RoomVia of the chain one shorter.
template <int kMoves>
struct RoomChainOf {
  using type = RoomVia<typename RoomChainOf<kMoves - 1>::type>;
};
template <>
struct RoomChainOf<1> {
  using type = RoomMove;
};
template <int kMoves>
using RoomChainOfT = typename RoomChainOf<kMoves>::type;
using RoomChain = RoomChainOfT<2>;   // tile_room_chain<2>
using RoomChain3 = RoomChainOfT<3>;  // tile_room_chain<3>

/// The first entry of full bucket `b`, in slot order, whose other bucket `search` (a
/// shorter chain's search there: `search(tile, t, other).from >= 0`) finds room in. A
/// bucket where it found none is not searched again. Its buckets differ from `b`: `b`
/// is full and, once the shorter chains failed there, no chain through `b` can start
/// or end in it. Reads only. @return the same in every lane.
template <class Inner, class Tile, class V, class Search>
DYNEMB_HD RoomVia<Inner> tile_room_via(const Tile& tile, const TableRef<V>& t, int64_t b,
                                       const Search& search) {
  const int64_t base = b * t.bucket_capacity;
  uint64_t roomless = 0;  // near_bit of the other buckets where search found none
  for (int64_t s = base; s < base + t.bucket_capacity; ++s) {
    const int64_t other = other_bucket(t, s, b);
    const uint64_t bit = near_bit(t, b, other);
    if (roomless & bit) continue;
    const Inner room = search(tile, t, other);
    if (room.from >= 0) return {room, s};
    roomless |= bit;
  }
  return {};
}

template <int kMoves, class Tile, class V>
DYNEMB_HD RoomChainOfT<kMoves> tile_room_chain(const Tile& tile, const TableRef<V>& t, int64_t b);

/// tile_room_chain<kMoves> as an argument of tile_room_via.
template <int kMoves>
struct RoomChainSearch {
  template <class Tile, class V>
  DYNEMB_HD RoomChainOfT<kMoves> operator()(const Tile& tile, const TableRef<V>& t,
                                            int64_t b) const {
    return tile_room_chain<kMoves>(tile, t, b);
  }
};

/// For a pass that owns the table, when no shorter chain found room in full bucket `b`:
/// a chain of kMoves moves (1: tile_room_in; more: the first entry of `b` whose other
/// bucket has a chain one shorter, tile_room_via). Reads only. @return the same in
/// every lane.
template <int kMoves, class Tile, class V>
DYNEMB_HD RoomChainOfT<kMoves> tile_room_chain(const Tile& tile, const TableRef<V>& t, int64_t b) {
  if constexpr (kMoves == 1) {
    return tile_room_in(tile, t, b);
  } else {
    return tile_room_via<RoomChainOfT<kMoves - 1>>(tile, t, b, RoomChainSearch<kMoves - 1>{});
  }
}

}  // namespace dynemb
