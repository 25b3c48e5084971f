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
/// Branch-free passes that vectorize: the minimum score; the smallest (digest, slot)
/// among the slots holding it; how many of those share that digest. Only when
/// several do (rare) are keys read. Comparing keys on every tie read all the key
/// lines of the bucket, and scores that count batches tie for most slots (STEP,
/// LFU, a cache tier's batch numbers).
template <class V>
DYNEMB_HD DYNEMB_INLINE int64_t bucket_victim(const TableRef<V>& t, int64_t bucket) {
  const int64_t base = bucket * t.bucket_capacity;
  const int64_t n = t.bucket_capacity;
  const uint64_t* scores = t.scores + base;
  const uint8_t* digests = t.digests + base;
  uint64_t low = ~uint64_t{0};
  for (int64_t s = 0; s < n; ++s) low = scores[s] < low ? scores[s] : low;
  uint64_t first = ~uint64_t{0};  // digest << 32 | slot, minimised over the low scores
  for (int64_t s = 0; s < n; ++s) {
    const uint64_t c = scores[s] == low ? uint64_t{digests[s]} << 32 | static_cast<uint64_t>(s)
                                        : ~uint64_t{0};
    first = c < first ? c : first;
  }
  const uint64_t digest = first >> 32;
  int64_t ties = 0;
  for (int64_t s = 0; s < n; ++s) ties += scores[s] == low && digests[s] == digest;
  if (ties == 1) return base + static_cast<int64_t>(first & 0xFFFFFFFFu);
  const int64_t* keys = t.keys + base;  // several share score and digest: the smaller key
  int64_t victim = -1;
  for (int64_t s = 0; s < n; ++s) {
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
