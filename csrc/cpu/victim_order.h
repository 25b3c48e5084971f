// dynemb CPU executor: a bucket's eviction victims taken level by level.
//
// A table that evicts continually takes many victims from one bucket in one batch
// (W-train at 0.25x capacity: ~70 of a 128-slot bucket), and tile_victim scans
// the whole bucket for each. But in pass 1 of a batch of distinct keys (core
// table_ops.h, "Batch rule"), once its hits are touched, the only change to a full
// bucket is a newcomer claiming the bucket's victim, and the claim pins that slot
// (it gets the batch's pin, which is at or above the floor). So the bucket's
// successive victims are its candidates (slots not pinned) in eviction order (core
// bucket_tile.h tile_victim_in: score, digest, key), and one scan can yield every
// candidate of the lowest score: scores that count batches or accesses tie for
// dozens of slots. Which slots are candidates stays the core's (VictimRule);
// tests/native/tile_bucket.cpp checks that the answers are tile_victim's.
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

#include "core/bucket.h"
#include "core/table_ops.h"

namespace dynemb::cpu {

/// Whether a batch may take its victims from BucketVictims: a distinct batch on a
/// table with pins whose pin is at or above the floor, so that every claim pins its
/// slot. Else each victim comes from its own tile_victim.
template <class V>
bool victim_levels_apply(const TableRef<V>& t, const UpsertArgs& u) {
  return u.distinct && t.has_pins() && t.has_scores() && u.pin >= u.pin_floor;
}

/// tile_victim's successive answers for one bucket while it changes only by claims
/// of them, each claim pinning its slot: front() is the victim now, pop() says it was
/// claimed. Holds the candidates of the lowest score in eviction order and scans
/// the bucket again when they are used up. `scratch`: storage for 2 *
/// t.bucket_capacity slot offsets, reused from bucket to bucket.
template <class V>
class BucketVictims {
 public:
  BucketVictims(const TableRef<V>& t, int64_t bucket, uint64_t pin_mask, uint64_t evict_below,
                uint32_t pin_floor, std::vector<int32_t>& scratch)
      : t_(t), base_(bucket * t.bucket_capacity), pin_mask_(pin_mask),
        evict_below_(evict_below), pin_floor_(pin_floor),
        candidates_(scratch.data()), level_(scratch.data() + t.bucket_capacity) {}

  /// The bucket's victim: the least candidate in eviction order, or -1 when every
  /// slot is pinned.
  int64_t front() {
    if (next_ == size_ && !all_pinned_) refill();
    return next_ < size_ ? base_ + level_[next_] : -1;
  }
  /// The victim front() gave was claimed.
  void pop() { ++next_; }

 private:
  /// The candidates of the lowest score, sorted by digest (a counting sort, stable on
  /// slot order), then runs of one digest by key.
  void refill() {
    const int64_t n = t_.bucket_capacity;
    const uint64_t* scores = t_.scores + base_;
    const uint32_t* pins = t_.pins + base_;
    const uint8_t* digests = t_.digests + base_;
    const int64_t* keys = t_.keys + base_;
    const VictimRule<true> rule(scores, pins, pin_mask_, evict_below_, pin_floor_);
    uint64_t low = ~uint64_t{0};
    uint64_t free = 0;
    for (int64_t s = 0; s < n; ++s) rule.fold_lowest(s, low, free);
    next_ = size_ = 0;
    if (!free) {  // and stays so: claims only pin more (the bucket's later keys fail)
      all_pinned_ = true;
      return;
    }
    int64_t m = 0;
    for (int64_t s = 0; s < n; ++s) {
      candidates_[m] = static_cast<int32_t>(s);
      m += static_cast<int64_t>(rule.candidate(s, low));
    }
    // Counting sort by digest, whose running sum walks only the digests present: a
    // level of one slot (distinct scores: CUSTOMIZED, DECAYED_LFU) costs little more
    // than tile_victim's scan.
    int32_t start[256];
    uint64_t present[4] = {0, 0, 0, 0};
    std::memset(start, 0, sizeof(start));
    for (int64_t k = 0; k < m; ++k) {
      const uint8_t d = digests[candidates_[k]];
      ++start[d];
      present[d >> 6] |= uint64_t{1} << (d & 63);
    }
    int32_t sum = 0;
    for (int w = 0; w < 4; ++w) {
      for (uint64_t bits = present[w]; bits != 0; bits &= bits - 1) {
        const int d = 64 * w + __builtin_ctzll(bits);
        const int32_t c = start[d];
        start[d] = sum;
        sum += c;
      }
    }
    for (int64_t k = 0; k < m; ++k) level_[start[digests[candidates_[k]]]++] = candidates_[k];
    for (int64_t k = 1; k < m; ++k) {  // insertion sort of each digest's run by key
      const int32_t s = level_[k];
      int64_t j = k;
      while (j > 0 && digests[level_[j - 1]] == digests[s] && keys[level_[j - 1]] > keys[s]) {
        level_[j] = level_[j - 1];
        --j;
      }
      level_[j] = s;
    }
    size_ = m;
  }

  const TableRef<V>& t_;
  int64_t base_;
  uint64_t pin_mask_;
  uint64_t evict_below_;
  uint32_t pin_floor_;
  int32_t* candidates_;  // the lowest score's slots in slot order
  int32_t* level_;       // the same in eviction order
  int64_t next_ = 0;
  int64_t size_ = 0;
  bool all_pinned_ = false;
};

}  // namespace dynemb::cpu
