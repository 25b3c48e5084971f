// dynemb core: scanning one bucket.
//
// A bucket is bucket_capacity consecutive slots, scanned as groups of 16
// digests: Platform::match16 turns a group into a bit mask of candidate slots
// and only candidates have their key compared, so a probe touches the 16-64
// digest bytes of a group before any key. The caller holds the bucket's lock
// when the table may change under it (see platform.h).
#pragma once

#include "core/hash.h"
#include "core/platform.h"
#include "core/score_policy.h"
#include "core/table_ref.h"

namespace dynemb {

/// @return the slot of `key` in `bucket`, or -1.
template <class P, class V>
DYNEMB_HD DYNEMB_INLINE int64_t bucket_find(const TableRef<V>& t, int64_t bucket, int64_t key,
                                            uint8_t digest) {
  const int64_t base = bucket * t.bucket_capacity;
  for (int64_t g = 0; g < t.bucket_capacity; g += 16) {
    uint32_t mask = P::match16(t.digests + base + g, digest);
    while (mask != 0) {
      const int64_t slot = base + g + lowest_bit(mask);
      if (t.keys[slot] == key) return slot;
      mask &= mask - 1;
    }
  }
  return -1;
}

/// @return the first empty slot of `bucket`, or -1 when the bucket is full.
template <class P, class V>
DYNEMB_HD DYNEMB_INLINE int64_t bucket_free_slot(const TableRef<V>& t, int64_t bucket) {
  const int64_t base = bucket * t.bucket_capacity;
  for (int64_t g = 0; g < t.bucket_capacity; g += 16) {
    const uint32_t mask = P::match16(t.digests + base + g, kEmptyDigest);
    if (mask != 0) return base + g + lowest_bit(mask);
  }
  return -1;
}

/// The eviction victim of a full bucket: the slot with the smallest (score, digest,
/// key). The digest (hash bits of the key) and then the key break ties, so the
/// choice is deterministic and independent of slot positions.
/// Requires t.scores (every strategy that evicts keeps scores).
///
/// Three passes: the minimum score, the smallest digest among the slots holding it,
/// the smallest key among those. The first two read the bucket's scores and digest
/// line and vectorize; the last reads the key of about one slot. Comparing keys on
/// every tie read all the key lines of the bucket: scores that count batches tie
/// for most slots (STEP, LFU, a cache tier's batch numbers).
template <class V>
DYNEMB_HD DYNEMB_INLINE int64_t bucket_victim(const TableRef<V>& t, int64_t bucket) {
  const int64_t base = bucket * t.bucket_capacity;
  const uint64_t* scores = t.scores + base;
  const uint8_t* digests = t.digests + base;
  const int64_t* keys = t.keys + base;
  uint64_t low = ~uint64_t{0};
  for (int64_t s = 0; s < t.bucket_capacity; ++s) low = scores[s] < low ? scores[s] : low;
  uint8_t digest = 0xFF;
  for (int64_t s = 0; s < t.bucket_capacity; ++s) {
    const uint8_t d = scores[s] == low ? digests[s] : uint8_t{0xFF};
    digest = d < digest ? d : digest;
  }
  int64_t victim = -1;
  for (int64_t s = 0; s < t.bucket_capacity; ++s) {
    if (scores[s] == low && digests[s] == digest && (victim < 0 || keys[s] < keys[victim])) {
      victim = s;
    }
  }
  return base + victim;
}

}  // namespace dynemb

namespace dynemb {

/// The slot a lookup of `digest` in `bucket` will most likely touch: the first
/// digest match, else the first empty slot, else -1. Executors use it only to
/// prefetch; it decides nothing.
template <class P, class V>
DYNEMB_HD DYNEMB_INLINE int64_t likely_slot(const TableRef<V>& t, int64_t bucket, uint8_t digest) {
  const int64_t base = bucket * t.bucket_capacity;
  int64_t empty = -1;
  for (int64_t g = 0; g < t.bucket_capacity; g += 16) {
    const uint32_t match = P::match16(t.digests + base + g, digest);
    if (match != 0) return base + g + lowest_bit(match);
    if (empty < 0) {
      const uint32_t free = P::match16(t.digests + base + g, kEmptyDigest);
      if (free != 0) empty = base + g + lowest_bit(free);
    }
  }
  return empty;
}

}  // namespace dynemb
