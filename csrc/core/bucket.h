// dynemb core: a bucket's probe order, and its victim search.
//
// A bucket is bucket_capacity consecutive slots in groups of 16: a digest compare
// turns the 16 digest bytes of a group into a bit mask of candidate slots, and only
// candidates have their key compared, so a probe reads digests before any key. The
// scans by key and for a free slot are written once, for a tile of lanes
// (bucket_tile.h), and run on a host by its one-lane SerialTile; the victim search
// is bucket_tile.h's tile_victim too, of the rule here (VictimRule).
//
// Probe order. A key scans the groups of its bucket in its own order: its home
// group h (hash.h) first, then h ^ 1, h ^ 2, ..., for k up to the group count
// rounded up to a power of two, skipping h ^ k past the last group (XOR by h
// permutes [0, 2^m), so every group is visited once). A new key takes the first
// empty slot in that order. Why XOR rather than h + 1, h + 2: with the bucket at a
// 64-byte boundary (bucket_capacity a multiple of 64, buffers 64-byte aligned), the
// first kLineGroups positions are the four groups of the home group's digest
// line, so a key leaves its home line only when the whole line is full.
//
// Hence, where keys are placed by insertion (a table below capacity, load factor
// 0.75, 128 slots: ~98% of keys in their home group, > 99.9% in their home line),
// a hit reads one digest line instead of bucket_capacity / 64, and executors
// can prefetch only that line (likely_slot).
//
// Holes. Every placement takes the first empty slot in the key's probe order (an
// upsert, a rehash, a move for room), or a victim's slot in a full bucket; so, until
// a slot of the bucket is emptied, no key sits past an empty slot of its probe order.
// Only an erase empties a slot for good (a rehash's move for room refills the slot
// it empties at once), and it sets the bucket's kHoled flag (table_ref.h), which only
// a rehash or clear takes back. Hence a key absent from its home line (probe
// positions [0, kLineGroups)) in a bucket without kHoled whose home line holds an
// empty slot is absent from the bucket: a miss reads one digest line, as a hit does
// (tile_bucket_find). What stays whole-bucket: a miss in a full home
// line or a holed bucket, and a full bucket's eviction victim, the minimum (score,
// digest, key) of all its slots; the newcomer takes the victim's slot wherever it
// is, so in a table that evicts continually keys sit anywhere and a hit reads the
// other lines as before.
//
// The caller holds the bucket's lock when the table may change under it (see
// platform.h).
#pragma once

#include "core/hash.h"
#include "core/platform.h"
#include "core/score_policy.h"
#include "core/table_ref.h"

namespace dynemb {

/// Digest groups in one 64-byte cache line.
constexpr int64_t kLineGroups = 4;

/// The probe order of one key in buckets of `groups` groups: position k is group
/// home ^ k, for k in [0, span) with home ^ k < groups.
struct ProbeOrder {
  int64_t home;
  int64_t groups;
  int64_t span;  // groups rounded up to a power of two

  ProbeOrder() = default;
  DYNEMB_HD ProbeOrder(uint64_t hash, int64_t bucket_capacity)
      : home(home_group_of(hash, bucket_capacity / 16)), groups(bucket_capacity / 16),
        span(power_of_two_at_least(groups)) {}
  /// Group at position k, or -1 when position k is skipped.
  DYNEMB_HD int64_t group(int64_t k) const {
    const int64_t g = home ^ k;
    return g < groups ? g : -1;
  }

  /// @param n in [1, 2^32]
  DYNEMB_HD static int64_t power_of_two_at_least(int64_t n) {
    uint64_t x = static_cast<uint64_t>(n - 1);  // smear the top bit down, without a loop
    x |= x >> 1;
    x |= x >> 2;
    x |= x >> 4;
    x |= x >> 8;
    x |= x >> 16;
    return static_cast<int64_t>(x + 1);
  }
};

/// What a key's hash decides in a table (hash.h): its home bucket, its digest and
/// its probe order. Executors that take a key through several stages (prefetch,
/// then the table operation) compute it once and pass it along.
struct KeyProbe {
  int64_t bucket;
  ProbeOrder order;
  uint8_t digest;

  KeyProbe() = default;
  template <class V>
  DYNEMB_HD KeyProbe(const TableRef<V>& t, int64_t key) : KeyProbe(of_hash(t, hash_key(key))) {}

  /// The probe of a key whose hash_key is `hash` (named, so that no integer key can
  /// reach it by an overload).
  template <class V>
  DYNEMB_HD static KeyProbe of_hash(const TableRef<V>& t, uint64_t hash) {
    KeyProbe p;
    p.bucket = bucket_of(hash, t.num_buckets);
    p.order = ProbeOrder(hash, t.bucket_capacity);
    p.digest = digest_of(hash);
    return p;
  }
};

/// The second bucket of a key homed at `home` whose hash is `h`, when a find must
/// read it (the home's overflow flag is set), else -1.
template <class V>
DYNEMB_HD DYNEMB_INLINE int64_t second_to_read(const TableRef<V>& t, uint64_t h, int64_t home) {
  return t.num_buckets > 1 && t.overflowed(home) ? second_bucket_of(h, t.num_buckets) : -1;
}

/// The victim search's rule over one bucket's score and pin columns: which slots are
/// pinned, and which are candidates. kPins: the table has pins (else only the score
/// floor pins). Every victim search (bucket_tile.h tile_victim_in, the CPU's
/// BucketVictims) runs its passes through it. Bit ops, not ?: or && (gcc vectorizes
/// only this form), in forced-inline members: gcc left a plain lambda out of line, a
/// call per slot and pass (the evicting W-train probe ran 5x slower).
template <bool kPins>
struct VictimRule {
  const uint64_t* scores;  // the bucket's
  const uint32_t* pins;    // the bucket's; unread unless kPins
  uint32_t pin_floor;
  uint64_t by_score;  // 0 under kEvictAny: the score floor pins nothing
  uint64_t pin_mask;
  uint64_t evict_below;

  DYNEMB_HD DYNEMB_INLINE VictimRule(const uint64_t* bucket_scores, const uint32_t* bucket_pins,
                                     uint64_t mask, uint64_t below, uint32_t floor)
      : scores(bucket_scores), pins(bucket_pins), pin_floor(floor),
        by_score(below != kEvictAny), pin_mask(mask), evict_below(below) {}

  /// 1 when slot s is pinned.
  DYNEMB_HD DYNEMB_INLINE uint64_t pinned(int64_t s) const {
    uint64_t held = 0;
    if constexpr (kPins) held = static_cast<uint64_t>(pins[s] >= pin_floor);
    return held | (by_score & static_cast<uint64_t>((scores[s] & pin_mask) >= evict_below));
  }
  /// The first pass, one slot at a time: `low` falls to the lowest score among the
  /// slots not pinned (a pinned slot counts as ~0), `free` becomes 1 when one is not.
  DYNEMB_HD DYNEMB_INLINE void fold_lowest(int64_t s, uint64_t& low, uint64_t& free) const {
    const uint64_t p = pinned(s);
    const uint64_t c = scores[s] | (uint64_t{0} - p);
    low = c < low ? c : low;
    free |= p ^ 1;
  }
  /// 1 when slot s is a candidate: not pinned, of score `low` (the first pass's; a
  /// pinned slot never, even when `low` is ~0).
  DYNEMB_HD DYNEMB_INLINE uint64_t candidate(int64_t s, uint64_t low) const {
    return (pinned(s) ^ 1) & static_cast<uint64_t>(scores[s] == low);
  }
};

/// The slot a lookup of `digest` in `bucket` will most likely touch, judged from
/// the first `positions` groups of the key's probe order (kLineGroups: its home
/// line): the first digest match there, else the first empty slot there, else -1.
/// Executors use it only to prefetch; it decides nothing.
template <class P, class V>
DYNEMB_HD DYNEMB_INLINE int64_t likely_slot(const TableRef<V>& t, int64_t bucket, uint8_t digest,
                                            const ProbeOrder& order, int64_t positions) {
  const int64_t base = bucket * t.bucket_capacity;
  int64_t empty = -1;
  for (int64_t k = 0; k < positions && k < order.span; ++k) {
    const int64_t g = order.group(k);
    if (g < 0) continue;
    const int64_t first = base + 16 * g;
    const uint32_t match = P::match16(t.digest_chunk(first, 16), digest);
    if (match != 0) return first + lowest_bit(match);
    if (empty < 0) {
      const uint32_t free = P::match16(t.digest_chunk(first, 16), kEmptyDigest);
      if (free != 0) empty = first + lowest_bit(free);
    }
  }
  return empty;
}

}  // namespace dynemb
