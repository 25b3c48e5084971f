// dynemb core: one bucket scanned by a tile of cooperating lanes.
//
// The scans of a bucket, written once for a tile: kSize lanes (1, 8, 16 or 32) that
// scan one bucket together for one key; a host runs them with the one lane of a
// SerialTile (its groups in the key's probe order: chunk_at), a device with a warp's
// tiles. Lane r reads the bucket's digests kChunk bytes at a time, chunks r, r +
// kSize, ... (kChunk = 128 / kSize, between 4 and 16: a tile of 8, 16 or 32 lanes
// reads a 128-slot bucket's digests in one load per lane, 16, 8 or 4 bytes wide), and
// votes; scores, pins and keys are read slot r, r + kSize, ... (consecutive lanes,
// consecutive words). The answers do not depend on kSize:
//
//   tile_bucket_find    the slot holding the key (a key holds one slot at most, so
//                       the lane that finds it is the only one; its slot is
//                       broadcast by shuffle), the key's home digest line first;
//   tile_free_slot      the first empty slot in the key's probe order: each lane's
//                       first empty slot ranked by (probe position, offset in its
//                       group), the tile's minimum rank;
//   tile_victim_in      the minimum (score, digest, key) of the slots not pinned:
//                       branch-free folds, each followed by a tile reduction.
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
/// least rank is the first in probe order (tile_free_slot's answer).
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
  if constexpr (Tile::kSize == 1) return 0;  // no division by the bucket's capacity
  constexpr int kChunk = chunk_bytes(Tile::kSize);
  return static_cast<int>(slot % t.bucket_capacity / kChunk % Tile::kSize);
}

/// The scans below step through a bucket's digests kChunk * kSize bytes at a time;
/// lane r reads, at step `first`, the chunk at offset chunk_at(first) (past the
/// bucket's end: none). A tile of several lanes reads the chunks in slot order, a lane
/// its own (digest_lane). The one lane of a SerialTile reads every 16-slot group, so it
/// reads them in the key's probe order (bucket.h: group home ^ k at step k, `home` its
/// home group, -1: slot order): its home group first, where nearly every key sits, and
/// its first empty slot is the bucket's first in probe order (scan_end: its steps run
/// to the bucket's groups rounded up to a power of two, which XOR by home permutes).
template <class Tile>
DYNEMB_HD DYNEMB_INLINE int64_t chunk_at(const Tile& tile, int64_t first, int64_t home) {
  if constexpr (Tile::kSize == 1) {
    return home < 0 ? first : first ^ (16 * home);
  } else {
    return first + chunk_bytes(Tile::kSize) * tile.rank();
  }
}

/// Where the steps of a scan of a bucket of `capacity` slots end (see chunk_at).
template <class Tile>
DYNEMB_HD DYNEMB_INLINE int64_t scan_end(int64_t capacity) {
  if constexpr (Tile::kSize == 1) {
    return 16 * ProbeOrder::power_of_two_at_least(capacity / 16);
  } else {
    return capacity;
  }
}

/// The steps [round_begin, round_end) of round `round` of a scan that reads the home
/// line of `home` first (round 0) and the rest of the bucket after (round 1), each
/// lane its chunks of the round. A SerialTile's steps in probe order put the home line
/// at steps [0, 64) (probe positions [0, kLineGroups)), so its rounds split there; a
/// wider tile's lanes step through the whole bucket in each round.
template <class Tile>
DYNEMB_HD DYNEMB_INLINE int64_t round_begin(int round, int64_t home) {
  return Tile::kSize == 1 && home >= 0 && round == 1 ? 16 * kLineGroups : 0;
}
template <class Tile>
DYNEMB_HD DYNEMB_INLINE int64_t round_end(int64_t capacity, int round, int64_t home) {
  constexpr int64_t kLine = 16 * kLineGroups;
  return Tile::kSize == 1 && home >= 0 && round == 0 && capacity > kLine
             ? kLine
             : scan_end<Tile>(capacity);
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
  // One round: the chunks of the home line (all of them when home < 0) or the rest.
  auto scan = [&](int round) DYNEMB_INLINE_LAMBDA -> int64_t {
    const int64_t end = round_end<Tile>(t.bucket_capacity, round, home);
    for (int64_t first = round_begin<Tile>(round, home); first < end;
         first += kChunk * Tile::kSize) {
      const int64_t mine = chunk_at(tile, first, home);
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
    return -1;
  };
  const int64_t slot = scan(0);
  // The rest, unless the home line has an empty slot in a bucket without kHoled
  // (bucket.h "Holes").
  if (slot >= 0 || home < 0 || (tile.ballot(room) != 0 && !t.holed(bucket))) return slot;
  return scan(1);
}

/// The find of `key` in a table, by a tile: its home bucket, then its second bucket past a
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

/// The empty slots of `bucket`. @return the same in every lane.
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

/// @return the first empty slot of `bucket` in probe order, or -1 when it is full,
/// the same in every lane.
template <class Tile, class V>
DYNEMB_HD DYNEMB_INLINE int64_t tile_free_slot(const Tile& tile, const TableRef<V>& t,
                                               int64_t bucket, const ProbeOrder& order) {
  constexpr int kChunk = chunk_bytes(Tile::kSize);
  const int64_t base = bucket * t.bucket_capacity;
  uint64_t best = ~uint64_t{0};
  const int64_t end = Tile::kSize == 1 ? 16 * order.span : t.bucket_capacity;  // scan_end
  for (int64_t first = 0; first < end; first += kChunk * Tile::kSize) {
    const int64_t mine = chunk_at(tile, first, order.home);
    if (mine >= t.bucket_capacity) continue;
    const uint32_t mask =
        tile.template match<kChunk>(t.digest_chunk(base + mine, kChunk), kEmptyDigest);
    if (mask == 0) continue;
    const uint64_t rank = probe_rank(mine + lowest_bit(mask), order);
    best = rank < best ? rank : best;
    if (Tile::kSize == 1) break;  // in probe order, the first empty slot is the answer
  }
  best = tile.min(best);
  return best == ~uint64_t{0} ? -1 : slot_of_rank(base, best, order);
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
/// A one-lane tile runs the two scans one after the other instead: the free slot's
/// scan stops at the first empty slot in probe order, nearly always in the home group,
/// whose line the find just read; the fused scan, which must rank every empty slot of
/// the home line, made the CPU's inserts of new keys 1.08x slower (count_upsert_cpu.py
/// --op assign, 4M slots).
/// @return the same in every lane.
template <class Tile, class V>
DYNEMB_HD DYNEMB_INLINE TileProbe tile_bucket_probe(const Tile& tile, const TableRef<V>& t,
                                                    int64_t bucket, int64_t key,
                                                    uint8_t digest, const ProbeOrder& order) {
  if constexpr (Tile::kSize == 1) {
    const int64_t slot = tile_bucket_find(tile, t, bucket, key, digest, order.home);
    return {slot, slot >= 0 ? -1 : tile_free_slot(tile, t, bucket, order)};
  }
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
    const int64_t end = round_end<Tile>(t.bucket_capacity, round, order.home);
    for (int64_t first = round_begin<Tile>(round, order.home); first < end;
         first += kChunk * Tile::kSize) {
      const int64_t mine = chunk_at(tile, first, order.home);
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

/// The eviction victim of a full bucket: among the slots not pinned, the one with
/// the smallest (score, digest, key); -1 when every slot is pinned. A slot is
/// pinned when its pin (t.pins; table_ops.h, "Pins") is >= `pin_floor`, or when the
/// part of its score under `pin_mask` is >= `evict_below` (the caller's floor;
/// kEvictAny pins nothing by score). The digest (hash bits of the key) and then the
/// key break ties, so the choice is deterministic and independent of slot positions
/// (keys are distinct in a bucket). Requires t.scores (every strategy that evicts
/// keeps scores). kPins: whether pins are read (tile_victim decides when).
///
/// Passes over the bucket, each a fold by every lane of its slots (r, r + kSize, ...)
/// and one tile reduction: the minimum candidate score (a pinned slot's is ~0) and
/// whether any slot is free to go; the smallest (digest, slot) among the slots
/// holding that minimum; how many of those share that digest. Only when several do
/// are keys read (two more passes). Comparing keys on every tie read all the key lines
/// of the bucket, and scores that count batches tie for most slots (STEP, LFU, a cache
/// tier's batch numbers). The passes are branch-free, so that a SerialTile's loops
/// vectorize (a branch per slot mispredicted: a quarter of the evicting W-train probe's
/// time), except that a lane of a wider tile reads the key of a tied slot only.
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
  uint64_t free = 0;  // 1 when some slot of this lane is not pinned
  for (int64_t s = tile.rank(); s < n; s += Tile::kSize) rule.fold_lowest(s, low, free);
  low = tile.min(low);
  if (tile.ballot(free != 0) == 0) return -1;  // all pinned
  uint64_t first = ~uint64_t{0};  // digest << 32 | slot, minimised over the candidates
  for (int64_t s = tile.rank(); s < n; s += Tile::kSize) {
    const uint64_t other = rule.candidate(s, low) - 1;  // 0 for a candidate, else ~0
    const uint64_t c = (uint64_t{digests[s]} << 32 | static_cast<uint64_t>(s)) | other;
    first = c < first ? c : first;
  }
  first = tile.min(first);
  const uint64_t digest = first >> 32;
  auto tied = [&](int64_t s) DYNEMB_INLINE_LAMBDA -> uint64_t {  // a candidate of that digest
    return rule.candidate(s, low) & static_cast<uint64_t>(digests[s] == digest);
  };
  uint64_t ties = 0;
  for (int64_t s = tile.rank(); s < n; s += Tile::kSize) ties += tied(s);
  if (tile.sum(ties) == 1) return base + static_cast<int64_t>(first & 0xFFFFFFFFu);
  // Several share score and digest: the smallest key (signed order: unsigned with the
  // sign bit flipped), then its slot. ~0 for a slot not tied.
  constexpr uint64_t kSign = uint64_t{1} << 63;
  const int64_t* keys = Tile::kSize == 1 ? t.bucket_keys(bucket) : nullptr;
  auto key_of = [&](int64_t s) DYNEMB_INLINE_LAMBDA -> uint64_t {
    if constexpr (Tile::kSize == 1) {
      return (static_cast<uint64_t>(keys[s]) ^ kSign) | (tied(s) - 1);
    } else {
      return tied(s) != 0 ? static_cast<uint64_t>(t.key(base + s)) ^ kSign : ~uint64_t{0};
    }
  };
  uint64_t least = ~uint64_t{0};
  for (int64_t s = tile.rank(); s < n; s += Tile::kSize) {
    const uint64_t k = key_of(s);
    least = k < least ? k : least;
  }
  least = tile.min(least);
  uint64_t victim = ~uint64_t{0};  // one tied slot holds `least`
  for (int64_t s = tile.rank(); s < n; s += Tile::kSize) {
    const uint64_t hit = tied(s) & static_cast<uint64_t>(key_of(s) == least);
    const uint64_t c = static_cast<uint64_t>(s) | (hit - 1);
    victim = c < victim ? c : victim;
  }
  return base + static_cast<int64_t>(tile.min(victim));
}

/// tile_victim_in<true>'s answer, reading the pin column only where it must: the
/// victim among the slots the score floor leaves (pins aside) is the victim among the
/// fewer slots pins leave too whenever its own pin is below the floor, the usual case
/// (a batch pins the keys it touched, whose scores are the newest, rarely the lowest);
/// else the bucket is scanned again with its pins. One pin line read, not eight.
template <class Tile, class V>
DYNEMB_HD DYNEMB_INLINE int64_t tile_victim(const Tile& tile, const TableRef<V>& t,
                                            int64_t bucket, uint64_t pin_mask,
                                            uint64_t evict_below, uint32_t pin_floor) {
  const int64_t v = tile_victim_in<false>(tile, t, bucket, pin_mask, evict_below, pin_floor);
  if (!t.has_pins() || v < 0 || t.pin(v) < pin_floor) return v;
  return tile_victim_in<true>(tile, t, bucket, pin_mask, evict_below, pin_floor);
}

}  // namespace dynemb
