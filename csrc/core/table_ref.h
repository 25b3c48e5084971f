// dynemb core: a non-owning view of one scored hash table's buffers.
//
// Memory layout (num_slots = num_buckets * bucket_capacity, slot s of bucket b is
// s = b * bucket_capacity + i):
//
//   struct Table {
//     uint8_t  digests[num_slots];              // 0 = empty, else digest_of(hash)
//     int64_t  keys[num_slots];                 // valid where digest != 0
//     uint64_t scores[num_slots];               // eviction score; absent (null) under NO_EVICTION
//     uint64_t timestamps[num_slots];           // last access; only for (TIMESTAMP, LFU)
//     V        values[fast_slots][row_width];   // rows of slots [0, fast_slots): fast tier
//     V        slow_values[num_slots - fast_slots][row_width];  // the rest: slow tier
//     uint32_t locks[num_buckets];              // 0 free, 1 held (Platform::lock)
//     uint8_t  overflow[num_buckets];           // 1: keys homed here may sit in the next bucket
//     uint32_t pins[num_slots];                 // the latest batch that looked the slot's
//                                               // key up (table_ops.h, "Pins"); absent
//                                               // (null) under NO_EVICTION
//   };
//
// A row is the embedding (dim) followed by the extra (optimizer state) columns.
// Hybrid tiers: the rows of one table may live in two buffers, split by slot
// index; on a GPU the fast one is device memory and the slow one pinned host
// memory, on a CPU both are host memory (the slow one possibly a file mapping).
// Without a slow tier fast_slots == num_slots. Only row() knows about the split.
//
// Invariants: a key occupies at most one slot; a key homed at bucket b lives in
// b, or (NO_EVICTION only) in b+1..b+k-1 where overflow[b..b+k-2] are all set
// (k <= kMaxProbeBuckets, indices modulo num_buckets). overflow is only cleared by
// a rehash or clear, so it may be set where no key is displaced any more. Inside
// a bucket a key may sit in any slot: the probe order of bucket.h decides where a
// new key goes (usually its home group), not where a lookup may stop.
#pragma once

#include "core/macros.h"

namespace dynemb {

/// Buckets a NO_EVICTION insert may walk before it reports the key as failed
/// (which makes the owner grow the table). Eviction strategies use 1.
constexpr int kMaxProbeBuckets = 4;

template <typename V>
struct TableRef {
  using Value = V;
  uint8_t* digests;     // (num_slots)
  int64_t* keys;        // (num_slots)
  uint64_t* scores;     // (num_slots) or nullptr
  uint64_t* timestamps; // (num_slots) or nullptr
  V* values;            // (fast_slots, row_width): fast tier
  V* slow_values;       // (num_slots - fast_slots, row_width): slow tier, or nullptr
  uint32_t* locks;      // (num_buckets)
  uint8_t* overflow;    // (num_buckets)
  uint32_t* pins;       // (num_slots) or nullptr: no slot is ever pinned
  int64_t num_buckets;
  int64_t bucket_capacity;  // multiple of 16
  int64_t row_width;        // dim + extra columns
  int64_t fast_slots;       // slots whose rows are in `values`

  DYNEMB_HD int64_t num_slots() const { return num_buckets * bucket_capacity; }
  DYNEMB_HD V* row(int64_t slot) const {
    return slot < fast_slots ? values + slot * row_width
                             : slow_values + (slot - fast_slots) * row_width;
  }
  DYNEMB_HD int64_t next_bucket(int64_t b) const { return b + 1 == num_buckets ? 0 : b + 1; }
};

}  // namespace dynemb
