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
//     uint32_t locks[num_buckets];              // unused: no op takes a bucket lock
//     uint8_t  overflow[num_buckets];           // bucket flags: kOverflowed (keys homed
//                                               // here may sit in their second bucket),
//                                               // kHoled (a slot was emptied: bucket.h)
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
// b, or (NO_EVICTION only) in its second bucket (hash.h second_bucket_of, one of
// b+1..b+kSecondBucketSpan modulo num_buckets) when overflow[b] has kOverflowed.
// The flags are only cleared by a rehash or clear, so kOverflowed may be set where no
// key is displaced any more. Inside a bucket the probe order of bucket.h decides
// where a new key goes (usually its home group); where a lookup may stop is decided
// by kHoled (bucket.h "Holes").
#pragma once

#include "core/access_count.h"
#include "core/macros.h"

namespace dynemb {

/// Buckets a NO_EVICTION key may occupy (its home and its second bucket) before an
/// insert reports it as failed (which makes the owner grow the table). Eviction
/// strategies use 1.
constexpr int kMaxProbeBuckets = 2;

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

  // Metadata goes through these accessors only (the layout above lives here), and each
  // reports its bytes to the emulated build's counter (access_count.h).
  DYNEMB_HD DYNEMB_INLINE static void count(Access a, const void* p, int64_t bytes) {
    DYNEMB_COUNT_ACCESS(a, p, bytes);
  }
  DYNEMB_HD DYNEMB_INLINE uint8_t digest(int64_t s) const {
    count(Access::kMetaRead, digests + s, 1);
    return digests[s];
  }
  /// The `bytes` digests from slot `first` on, read at once (a group match).
  DYNEMB_HD DYNEMB_INLINE const uint8_t* digest_chunk(int64_t first, int64_t bytes) const {
    count(Access::kMetaRead, digests + first, bytes);
    return digests + first;
  }
  DYNEMB_HD DYNEMB_INLINE void set_digest(int64_t s, uint8_t d) const {
    count(Access::kMetaWrite, digests + s, 1);
    digests[s] = d;
  }
  DYNEMB_HD DYNEMB_INLINE int64_t key(int64_t s) const {
    count(Access::kMetaRead, keys + s, sizeof(int64_t));
    return keys[s];
  }
  DYNEMB_HD DYNEMB_INLINE void set_key(int64_t s, int64_t k) const {
    count(Access::kMetaWrite, keys + s, sizeof(int64_t));
    keys[s] = k;
  }
  DYNEMB_HD DYNEMB_INLINE bool has_scores() const { return scores != nullptr; }
  DYNEMB_HD DYNEMB_INLINE uint64_t score(int64_t s) const {
    count(Access::kMetaRead, scores + s, sizeof(uint64_t));
    return scores[s];
  }
  DYNEMB_HD DYNEMB_INLINE void set_score(int64_t s, uint64_t v) const {
    count(Access::kMetaWrite, scores + s, sizeof(uint64_t));
    scores[s] = v;
  }
  DYNEMB_HD DYNEMB_INLINE bool has_timestamps() const { return timestamps != nullptr; }
  DYNEMB_HD DYNEMB_INLINE uint64_t timestamp(int64_t s) const {
    count(Access::kMetaRead, timestamps + s, sizeof(uint64_t));
    return timestamps[s];
  }
  DYNEMB_HD DYNEMB_INLINE void set_timestamp(int64_t s, uint64_t v) const {
    count(Access::kMetaWrite, timestamps + s, sizeof(uint64_t));
    timestamps[s] = v;
  }
  DYNEMB_HD DYNEMB_INLINE bool has_pins() const { return pins != nullptr; }
  DYNEMB_HD DYNEMB_INLINE uint32_t pin(int64_t s) const {
    count(Access::kMetaRead, pins + s, sizeof(uint32_t));
    return pins[s];
  }
  DYNEMB_HD DYNEMB_INLINE void set_pin(int64_t s, uint32_t v) const {
    count(Access::kMetaWrite, pins + s, sizeof(uint32_t));
    pins[s] = v;
  }
  // Bucket flags (overflow[b]). Pass 1 of a NO_EVICTION upsert sets kOverflowed of a
  // key's home bucket from the thread that owns its second bucket, so owners of two
  // second buckets may set one flag together (the same bit, read only after the pass);
  // erases set kHoled, and no op sets both kinds: relaxed atomics on a host, plain
  // bytes on a GPU, where two lanes' read-modify-writes of one byte set the same bit.
  static constexpr uint8_t kOverflowed = 1;
  static constexpr uint8_t kHoled = 2;
  DYNEMB_HD DYNEMB_INLINE uint8_t flags(int64_t b) const {
    count(Access::kMetaRead, overflow + b, 1);
#if defined(__CUDA_ARCH__)
    return overflow[b];
#else
    return __atomic_load_n(overflow + b, __ATOMIC_RELAXED);
#endif
  }
  DYNEMB_HD DYNEMB_INLINE void set_flag(int64_t b, uint8_t flag) const {
    count(Access::kMetaWrite, overflow + b, 1);
#if defined(__CUDA_ARCH__)
    overflow[b] |= flag;
#else
    __atomic_fetch_or(overflow + b, flag, __ATOMIC_RELAXED);
#endif
  }
  DYNEMB_HD DYNEMB_INLINE bool overflowed(int64_t b) const { return flags(b) & kOverflowed; }
  DYNEMB_HD DYNEMB_INLINE void set_overflowed(int64_t b) const { set_flag(b, kOverflowed); }
  DYNEMB_HD DYNEMB_INLINE bool holed(int64_t b) const { return flags(b) & kHoled; }
  DYNEMB_HD DYNEMB_INLINE void set_holed(int64_t b) const { set_flag(b, kHoled); }
  // A whole bucket's column, for a scan that reads every slot (a victim search);
  // `counted`: whether this call reports the bucket's bytes (one lane of a tile does).
  DYNEMB_HD DYNEMB_INLINE const uint8_t* bucket_digests(int64_t b, bool counted = true) const {
    if (counted) count(Access::kMetaRead, digests + b * bucket_capacity, bucket_capacity);
    return digests + b * bucket_capacity;
  }
  DYNEMB_HD DYNEMB_INLINE const int64_t* bucket_keys(int64_t b, bool counted = true) const {
    if (counted) count(Access::kMetaRead, keys + b * bucket_capacity, bucket_capacity * 8);
    return keys + b * bucket_capacity;
  }
  DYNEMB_HD DYNEMB_INLINE const uint64_t* bucket_scores(int64_t b, bool counted = true) const {
    if (counted) count(Access::kMetaRead, scores + b * bucket_capacity, bucket_capacity * 8);
    return scores + b * bucket_capacity;
  }
  DYNEMB_HD DYNEMB_INLINE const uint32_t* bucket_pins(int64_t b, bool counted = true) const {
    if (counted) count(Access::kMetaRead, pins + b * bucket_capacity, bucket_capacity * 4);
    return pins + b * bucket_capacity;
  }
  /// Reports a read or write (Access::kRowRead, kRowWrite) of `bytes` of slot's row.
  DYNEMB_HD DYNEMB_INLINE void count_row(Access a, int64_t slot, int64_t bytes) const {
    count(a, row(slot), bytes);
  }

  DYNEMB_HD V* row(int64_t slot) const {
    return slot < fast_slots ? values + slot * row_width
                             : slow_values + (slot - fast_slots) * row_width;
  }
};

}  // namespace dynemb
