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

/// The eviction victim of a full bucket: the slot with the smallest (score, key).
/// Requires t.scores (every strategy that evicts keeps scores).
///
/// Three branch-free passes (the minimum score, the minimum key among the slots
/// holding it, the slot of that key) instead of one loop comparing pairs: the
/// passes vectorize, and a pairwise loop mispredicts on every tie, which is most
/// slots of a bucket scored by batch numbers (a cache tier).
template <class V>
DYNEMB_HD DYNEMB_INLINE int64_t bucket_victim(const TableRef<V>& t, int64_t bucket) {
  const int64_t base = bucket * t.bucket_capacity;
  const uint64_t* scores = t.scores + base;
  const int64_t* keys = t.keys + base;
  uint64_t low = ~uint64_t{0};
  for (int64_t s = 0; s < t.bucket_capacity; ++s) low = scores[s] < low ? scores[s] : low;
  int64_t key = INT64_MAX;
  for (int64_t s = 0; s < t.bucket_capacity; ++s) {
    const int64_t k = scores[s] == low ? keys[s] : INT64_MAX;
    key = k < key ? k : key;
  }
  for (int64_t s = 0; s < t.bucket_capacity; ++s) {
    if (scores[s] == low && keys[s] == key) return base + s;
  }
  return base;  // unreachable: a slot holds (low, key)
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
