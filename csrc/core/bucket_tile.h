// dynemb core: one bucket scanned by a tile of cooperating lanes.
//
// bucket.h's scans written for a tile: kSize lanes (1, 8, 16 or 32) that scan one
// bucket together for one key. Lane r reads the bucket's digests kChunk bytes at a
// time, chunks r, r + kSize, ... (kChunk = 128 / kSize, between 4 and 16: a tile of
// 8, 16 or 32 lanes reads a 128-slot bucket's digests in one load per lane, 16, 8 or
// 4 bytes wide), and votes; scores, pins and keys are read slot r, r + kSize, ...
// (consecutive lanes, consecutive words). The answers are bucket.h's exactly:
//
//   tile_bucket_find    the slot holding the key (a key holds one slot at most, so
//                       the lane that finds it is the only one; its slot is
//                       broadcast by shuffle), the key's home digest line first;
//   tile_free_slot      the first empty slot in the key's probe order: each lane's
//                       first empty slot ranked by (probe position, offset in its
//                       group), the tile's minimum rank;
//   tile_victim_in      the minimum (score, digest, key) of the slots not pinned,
//                       and on a full tie of all three the lowest slot (bucket_victim_in's
//                       rule): three tile minimum reductions, then the lowest
//                       matching slot.
//
// Every lane returns the same answer, so a tile's control flow stays uniform and
// its collectives are reached by all of its lanes.
//
// The tile concept (a SerialTile of one lane for hosts and tests; cuda/tile.cuh's
// cooperative-groups tile on devices):
//
//   struct Tile {
//     static constexpr int kSize;                 // lanes: a power of two <= 32
//     int rank() const;                           // this lane, in [0, kSize)
//     uint32_t ballot(bool vote) const;           // bit r: lane r's vote
//     template <class T> T shfl(T v, int src) const;  // lane src's v
//     uint64_t min(uint64_t v) const;             // the minimum of v over the lanes
//     uint64_t sum(uint64_t v) const;             // the sum of v over the lanes
//     void sync() const;                          // a lane's earlier writes are seen
//                                                 //   by the tile's lanes after it
//     template <int kBytes>                       // match_chunk<kBytes>: one load of
//     uint32_t match(const uint8_t* digests,      //   kBytes at a kBytes-aligned
//                    uint8_t digest) const;       //   address (a device faults on
//   };                                            //   another)
#pragma once

#include "core/bucket.h"

namespace dynemb {

/// A tile of one lane: every collective is the lane's own value.
struct SerialTile {
  static constexpr int kSize = 1;
  DYNEMB_HD int rank() const { return 0; }
  DYNEMB_HD uint32_t ballot(bool vote) const { return vote ? 1u : 0u; }
  template <class T>
  DYNEMB_HD T shfl(T v, int) const {
    return v;
  }
  DYNEMB_HD uint64_t min(uint64_t v) const { return v; }
  DYNEMB_HD uint64_t sum(uint64_t v) const { return v; }
  DYNEMB_HD void sync() const {}
  template <int kBytes>
  DYNEMB_HD uint32_t match(const uint8_t* digests, uint8_t digest) const {
    return match_chunk<kBytes>(digests, digest);
  }
};

/// Digest bytes one lane of a tile of `size` lanes reads at a time: 128 / size,
/// clamped to [4, 16] (one load per lane covers a 128-slot bucket).
constexpr int chunk_bytes(int size) { return size >= 32 ? 4 : size >= 16 ? 8 : 16; }

/// The rank of slot `s` of a bucket (its offset there) in a key's probe order: its
/// group's probe position g ^ home, then its offset in the group. The empty slot of
/// least rank is the first in probe order (bucket_free_slot's).
DYNEMB_HD DYNEMB_INLINE uint64_t probe_rank(int64_t s, const ProbeOrder& order) {
  return static_cast<uint64_t>(((s >> 4) ^ order.home) << 4 | (s & 15));
}

/// The slot of the bucket starting at slot `base` whose probe_rank is `rank`.
DYNEMB_HD DYNEMB_INLINE int64_t slot_of_rank(int64_t base, uint64_t rank,
                                             const ProbeOrder& order) {
  const auto r = static_cast<int64_t>(rank);
  return base + 16 * ((r >> 4) ^ order.home) + (r & 15);
}

/// The lane whose chunks hold `slot`'s digest in the scans below (tile_bucket_find,
/// tile_free_slot), and so the only lane that read it, or the slot's key (read for a
/// digest match only): that lane may overwrite them (claim, erase) without a sync after
/// the scans, whose votes and shuffles order no memory between lanes.
template <class Tile, class V>
DYNEMB_HD DYNEMB_INLINE int digest_lane(const Tile&, const TableRef<V>& t, int64_t slot) {
  constexpr int kChunk = chunk_bytes(Tile::kSize);
  return static_cast<int>(slot % t.bucket_capacity / kChunk % Tile::kSize);
}

/// @return the slot of `key` in `bucket`, or -1, the same in every lane. `home`: the
/// key's home group (ProbeOrder::home), whose 64-byte digest line is scanned first,
/// the rest of the bucket only when the key is not there (bucket.h: nearly every key
/// sits in its home line, so a hit reads one digest line, not bucket_capacity / 64);
/// -1: the whole bucket at once. Either way each lane reads only its own chunks
/// (digest_lane), in two rounds instead of one.
template <class Tile, class V>
DYNEMB_HD DYNEMB_INLINE int64_t tile_bucket_find(const Tile& tile, const TableRef<V>& t,
                                                 int64_t bucket, int64_t key, uint8_t digest,
                                                 int64_t home = -1) {
  constexpr int kChunk = chunk_bytes(Tile::kSize);
  const int64_t base = bucket * t.bucket_capacity;
  const int64_t line = home < 0 ? -1 : (16 * home) & ~int64_t{63};  // its first slot
  bool room = false;  // this lane's chunks of the home line have an empty slot
  // round 0: the chunks in the home line (all of them when home < 0); round 1: the rest,
  // unless the home line has an empty slot in a bucket without kHoled (bucket.h "Holes").
  for (int round = 0; round < (home < 0 ? 1 : 2); ++round) {
    if (round == 1 && tile.ballot(room) != 0 && !t.holed(bucket)) return -1;
    for (int64_t first = 0; first < t.bucket_capacity; first += kChunk * Tile::kSize) {
      const int64_t mine = first + kChunk * tile.rank();
      const bool in_line = home < 0 || (mine & ~int64_t{63}) == line;
      int64_t slot = -1;
      if (mine < t.bucket_capacity && in_line == (round == 0)) {
        const uint8_t* chunk = t.digest_chunk(base + mine, kChunk);
        uint32_t mask = tile.template match<kChunk>(chunk, digest);
        while (mask != 0 && slot < 0) {
          const int64_t s = base + mine + lowest_bit(mask);
          if (t.key(s) == key) slot = s;
          mask &= mask - 1;
        }
        if (round == 0) room = room || tile.template match<kChunk>(chunk, kEmptyDigest) != 0;
      }
      const uint32_t hits = tile.ballot(slot >= 0);
      if (hits != 0) return tile.shfl(slot, lowest_bit(hits));
    }
  }
  return -1;
}

/// What one probe of a bucket for a key yields: the key's slot, else the bucket's first
/// empty slot in the key's probe order (-1: the bucket is full).
struct TileProbe {
  int64_t slot;  // the key's slot, or -1
  int64_t free;  // with slot -1: tile_free_slot's answer; with a slot: -1, not looked for
};

/// tile_bucket_find (its home line first) and, for a key not in the bucket,
/// tile_free_slot, in one scan: each chunk the find loads is also matched against the
/// empty digest, and the lanes' first empty ranks (probe position, offset in its
/// group) go to one minimum reduction. A new key reads the bucket's digests once.
/// @return the same in every lane.
template <class Tile, class V>
DYNEMB_HD DYNEMB_INLINE TileProbe tile_bucket_probe(const Tile& tile, const TableRef<V>& t,
                                                    int64_t bucket, int64_t key,
                                                    uint8_t digest, const ProbeOrder& order) {
  constexpr int kChunk = chunk_bytes(Tile::kSize);
  const int64_t base = bucket * t.bucket_capacity;
  const int64_t line = (16 * order.home) & ~int64_t{63};  // the home line's first slot
  uint64_t best = ~uint64_t{0};  // this lane's first empty rank
  for (int round = 0; round < 2; ++round) {  // 0: the chunks in the home line; 1: the rest
    if (round == 1) {
      // An empty slot in the home line comes first in probe order (its ranks are the
      // lowest) and, in a bucket without kHoled, proves the key absent (bucket.h "Holes").
      const uint64_t line_best = tile.min(best);
      if (line_best != ~uint64_t{0} && !t.holed(bucket)) {
        return {-1, slot_of_rank(base, line_best, order)};
      }
    }
    for (int64_t first = 0; first < t.bucket_capacity; first += kChunk * Tile::kSize) {
      const int64_t mine = first + kChunk * tile.rank();
      int64_t slot = -1;
      if (mine < t.bucket_capacity && ((mine & ~int64_t{63}) == line) == (round == 0)) {
        const uint8_t* chunk = t.digest_chunk(base + mine, kChunk);
        uint32_t mask = tile.template match<kChunk>(chunk, digest);
        while (mask != 0 && slot < 0) {
          const int64_t s = base + mine + lowest_bit(mask);
          if (t.key(s) == key) slot = s;
          mask &= mask - 1;
        }
        const uint32_t empty = tile.template match<kChunk>(chunk, kEmptyDigest);
        if (empty != 0) {
          const uint64_t rank = probe_rank(mine + lowest_bit(empty), order);
          best = rank < best ? rank : best;
        }
      }
      const uint32_t hits = tile.ballot(slot >= 0);
      if (hits != 0) return {tile.shfl(slot, lowest_bit(hits)), -1};
    }
  }
  best = tile.min(best);
  return {-1, best == ~uint64_t{0} ? -1 : slot_of_rank(base, best, order)};
}

/// find_slot (table_ops.h) by a tile: the home bucket, then the second bucket past a
/// flagged home. @return the slot holding `key`, or -1, the same in every lane.
template <class Tile, class V>
DYNEMB_HD int64_t tile_find_slot(const Tile& tile, const TableRef<V>& t, int64_t key) {
  const uint64_t h = hash_key(key);
  const uint8_t digest = digest_of(h);
  const int64_t group = home_group_of(h, t.bucket_capacity / 16);
  const int64_t home = bucket_of(h, t.num_buckets);
  const int64_t slot = tile_bucket_find(tile, t, home, key, digest, group);
  if (slot >= 0) return slot;
  const int64_t second = second_to_read(t, h, home);
  return second < 0 ? -1 : tile_bucket_find(tile, t, second, key, digest, group);
}

/// bucket_free_count by a tile. @return the same in every lane.
template <class Tile, class V>
DYNEMB_HD DYNEMB_INLINE int64_t tile_free_count(const Tile& tile, const TableRef<V>& t,
                                                int64_t bucket) {
  constexpr int kChunk = chunk_bytes(Tile::kSize);
  const int64_t base = bucket * t.bucket_capacity;
  uint64_t free = 0;
  for (int64_t mine = kChunk * tile.rank(); mine < t.bucket_capacity;
       mine += kChunk * Tile::kSize) {
    free += popcount32(
        tile.template match<kChunk>(t.digest_chunk(base + mine, kChunk), kEmptyDigest));
  }
  return static_cast<int64_t>(tile.sum(free));
}

/// bucket_free_slot by a tile. @return the first empty slot of `bucket` in probe
/// order, or -1 when it is full, the same in every lane.
template <class Tile, class V>
DYNEMB_HD DYNEMB_INLINE int64_t tile_free_slot(const Tile& tile, const TableRef<V>& t,
                                               int64_t bucket, const ProbeOrder& order) {
  constexpr int kChunk = chunk_bytes(Tile::kSize);
  const int64_t base = bucket * t.bucket_capacity;
  uint64_t best = ~uint64_t{0};
  for (int64_t mine = kChunk * tile.rank(); mine < t.bucket_capacity;
       mine += kChunk * Tile::kSize) {
    const uint32_t mask =
        tile.template match<kChunk>(t.digest_chunk(base + mine, kChunk), kEmptyDigest);
    if (mask == 0) continue;
    const uint64_t rank = probe_rank(mine + lowest_bit(mask), order);
    best = rank < best ? rank : best;
  }
  best = tile.min(best);
  return best == ~uint64_t{0} ? -1 : slot_of_rank(base, best, order);
}

/// bucket_victim_in by a tile (same arguments, same rule). @return the victim's
/// slot, or -1 when every slot is pinned, the same in every lane.
template <bool kPins, class Tile, class V>
DYNEMB_HD int64_t tile_victim_in(const Tile& tile, const TableRef<V>& t, int64_t bucket,
                                 uint64_t pin_mask, uint64_t evict_below, uint32_t pin_floor) {
  const int64_t base = bucket * t.bucket_capacity;
  const int64_t n = t.bucket_capacity;
  const bool lead = tile.rank() == 0;  // reports the bucket's bytes for the tile
  const uint64_t* scores = t.bucket_scores(bucket, lead);
  const uint8_t* digests = t.bucket_digests(bucket, lead);
  const uint32_t* pins = kPins ? t.bucket_pins(bucket, lead) : nullptr;
  const VictimRule<kPins> rule(scores, pins, pin_mask, evict_below, pin_floor);
  uint64_t low = ~uint64_t{0};
  uint64_t free = 0;
  for (int64_t s = tile.rank(); s < n; s += Tile::kSize) rule.fold_lowest(s, low, free);
  low = tile.min(low);
  if (tile.ballot(free != 0) == 0) return -1;
  // Among the slots not pinned holding the minimum score: the smallest digest, then
  // the smallest key (as an unsigned number with its sign bit flipped: signed order).
  auto candidate = [&](int64_t s) DYNEMB_INLINE_LAMBDA { return rule.candidate(s, low) != 0; };
  uint64_t digest = ~uint64_t{0};
  for (int64_t s = tile.rank(); s < n; s += Tile::kSize) {
    if (candidate(s) && digests[s] < digest) digest = digests[s];
  }
  digest = tile.min(digest);
  constexpr uint64_t kSign = uint64_t{1} << 63;
  uint64_t key = ~uint64_t{0};
  // Keys are read for the candidates of that digest only (rarely more than one).
  auto key_of = [&](int64_t s) DYNEMB_INLINE_LAMBDA -> uint64_t {
    return candidate(s) && digests[s] == digest ? static_cast<uint64_t>(t.key(base + s)) ^ kSign
                                                : ~uint64_t{0};
  };
  for (int64_t s = tile.rank(); s < n; s += Tile::kSize) {
    const uint64_t k = key_of(s);
    key = k < key ? k : key;
  }
  key = tile.min(key);
  uint64_t slot = ~uint64_t{0};
  for (int64_t s = tile.rank(); s < n && slot == ~uint64_t{0}; s += Tile::kSize) {
    if (candidate(s) && digests[s] == digest && key_of(s) == key) slot = static_cast<uint64_t>(s);
  }
  return base + static_cast<int64_t>(tile.min(slot));
}

/// bucket_victim by a tile.
template <class Tile, class V>
DYNEMB_HD DYNEMB_INLINE int64_t tile_victim(const Tile& tile, const TableRef<V>& t,
                                            int64_t bucket, uint64_t pin_mask,
                                            uint64_t evict_below, uint32_t pin_floor) {
  return t.has_pins()
             ? tile_victim_in<true>(tile, t, bucket, pin_mask, evict_below, pin_floor)
             : tile_victim_in<false>(tile, t, bucket, pin_mask, evict_below, pin_floor);
}

}  // namespace dynemb
