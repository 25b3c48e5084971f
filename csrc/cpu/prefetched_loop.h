// dynemb CPU executor: batch loops that overlap the cache misses of many keys.
//
// Software-pipelined group prefetching: keys go in groups of kGroup; while the
// body runs on group g, the key, score, pin and row of each key's likely slot are
// prefetched for group g + 1 (whose digests arrived meanwhile), and the digests
// (the key's home line or the whole bucket, see BucketSpan) for group g + 2, with
// what else a writer's body reads first (the bucket's overflow byte).
//
// What limits these loops is the number of misses the core keeps in flight (its
// miss buffers), not latency: a needless line (a row nobody reads) stalls every
// prefetch behind it. So a loop fetches only the lines its body touches (RowUse; rows
// that a body writes whole with streaming stores are not fetched at all), and the
// group size is per loop: read-only loops (find, erase), which keep fewer lines per
// key in flight, run further ahead.
//
// Nothing here decides anything: the body reads everything from the table; the
// prefetches and the slot hint only make its lines arrive early. What it may take
// from stage 1 is the key's KeyProbe (core/bucket.h), a function of the key and the
// table's shape, which no loop changes.
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "core/bucket.h"
#include "core/hash.h"
#include "cpu/cpu_platform.h"

namespace dynemb::cpu {

/// Keys per pipeline stage of loops that change the table (upserts). W-table on our
/// 2-core machines: 16 brings nothing here.
constexpr int64_t kWriteGroup = 8;
/// Keys per pipeline stage of read-only loops (find, erase, find_slots). W-table, 1
/// thread, against 8: find +9%, erase +29%; 2 threads: the same.
constexpr int64_t kReadGroup = 16;

/// How much of each bucket a batch loop prefetches. A key's home digest line is
/// enough while keys sit in it (a table filled by inserts, bucket.h). A key whose
/// home line is full without a match may sit in another line (in a table that
/// evicts continually, a newcomer takes its victim's slot wherever it is): its
/// other lines, fetched one group late, stall the body about two memory latencies
/// (the lines, then the key and row), the cost of some 32 needless line fetches.
/// So a loop prefetches whole buckets for the next kWindow keys when more than
/// 1/32 of the last kWindow keys had such a home line, and home lines only
/// otherwise. (A new key whose home line has room needs the other lines only to
/// prove its absence; fetched one group late, they arrive in time.)
class BucketSpan {
 public:
  bool whole() const { return whole_; }
  void count(bool full_home_line) {
    missed_ += full_home_line;
    if (++seen_ == kWindow) {
      whole_ = missed_ * 32 > kWindow;
      seen_ = missed_ = 0;
    }
  }

 private:
  static constexpr int kWindow = 256;
  bool whole_ = false;
  int seen_ = 0;
  int missed_ = 0;
};

/// Which value rows a loop body reads or partly writes, so that prefetching fetches
/// only those: rows are 4+ cache lines each.
enum class RowUse { kNone, kNewOnly, kHitsOnly, kAll };

/// What a loop body touches besides digests, keys and rows.
enum class Touches {
  kRead,   ///< nothing else (find, erase)
  kWrite,  ///< a writer: the overflow byte, the slot's score, timestamp and pin
};

namespace detail {

/// Prefetches the digest lines of `bucket` except the one holding `skip` (or none).
template <class V>
DYNEMB_INLINE void prefetch_bucket_lines(const TableRef<V>& t, int64_t bucket,
                                         const uint8_t* skip) {
  const uint8_t* first = t.digests + bucket * t.bucket_capacity;
  const auto line_of = [](const uint8_t* p) { return reinterpret_cast<uintptr_t>(p) / 64; };
  const uintptr_t skipped = skip ? line_of(skip) : 0;
  for (uintptr_t line = line_of(first); line <= line_of(first + t.bucket_capacity - 1); ++line) {
    if (line != skipped) CpuPlatform::prefetch(reinterpret_cast<const void*>(line * 64));
  }
}

/// Stage 1: the key's digests and its bucket's flags (overflow byte).
template <class V>
DYNEMB_INLINE void prefetch_digests(const TableRef<V>& t, const KeyProbe& p,
                                    const BucketSpan& span) {
  const int64_t b = p.bucket;
  if (span.whole()) {
    prefetch_bucket_lines(t, b, nullptr);
  } else {
    CpuPlatform::prefetch(t.digests + b * t.bucket_capacity + 16 * p.order.home);
  }
  CpuPlatform::prefetch(t.overflow + b);  // its flags: kHoled decides a miss (stage 2)
}

/// Stage 2: prefetches the likely slot of key; @return it (-1 if none), a hint for
/// find_slot_hinted. When the home line holds no match, the likely slot is sought in
/// the whole bucket if `span` prefetched it, else the bucket's other lines are
/// prefetched for the body.
template <Touches kTouches, RowUse kRows, bool kVictims, class V>
DYNEMB_INLINE int64_t prefetch_slot(const TableRef<V>& t, const KeyProbe& p, BucketSpan& span) {
  const int64_t b = p.bucket;
  const ProbeOrder& order = p.order;
  const uint8_t digest = p.digest;
  int64_t slot = likely_slot<CpuPlatform>(t, b, digest, order, kLineGroups);
  span.count(slot < 0);
  if (slot < 0 || t.digest(slot) != digest) {  // no match in the home line
    if (span.whole()) {
      slot = likely_slot<CpuPlatform>(t, b, digest, order, order.span);
    } else if (slot < 0 || t.holed(b)) {
      // (An empty slot in the home line of a bucket without kHoled proves a miss:
      // bucket.h "Holes".)
      prefetch_bucket_lines(t, b, t.digests + b * t.bucket_capacity + 16 * order.home);
    }
  }
  if (slot < 0) {
    // A full bucket without a match: an upsert of a new key scans every score for
    // its victim (tile_victim), unless the loop leaves victims to a later one.
    if (kTouches != Touches::kRead && kVictims && t.scores && span.whole()) {
      const int64_t first = b * t.bucket_capacity;
      CpuPlatform::prefetch_lines(t.scores + first, t.bucket_capacity * int64_t{sizeof(uint64_t)});
    }
    return slot;
  }
  CpuPlatform::prefetch(t.keys + slot);
  if (kTouches != Touches::kRead) {
    // What touch and claim write (core table_ops.h): the score, the timestamp beside
    // it (compound strategies) and the batch's pin. A line left to the body's write is
    // a demand miss per key.
    if (t.scores) CpuPlatform::prefetch_for_write(t.scores + slot);
    if (t.timestamps) CpuPlatform::prefetch_for_write(t.timestamps + slot);
    if (t.pins) CpuPlatform::prefetch_for_write(t.pins + slot);
  }
  const bool is_new = t.digest(slot) == kEmptyDigest;  // likely_slot found no match
  if (kRows == RowUse::kAll || (kRows == RowUse::kNewOnly && is_new) ||
      (kRows == RowUse::kHitsOnly && !is_new)) {
    CpuPlatform::prefetch_lines(t.row(slot), t.row_width * static_cast<int64_t>(sizeof(V)));
  }
  return slot;
}

/// Stage 2 of a key that may sit in its second bucket (`second`, whose home line
/// stage 1 prefetched), given `slot`, stage 2's answer in the home bucket: when the
/// home line holds no match, the key's likely slot in the second bucket's home line
/// if a digest matches there (its key and row are prefetched), else `slot`.
template <RowUse kRows, class V>
DYNEMB_INLINE int64_t prefetch_second_slot(const TableRef<V>& t, const KeyProbe& p,
                                           int64_t second, int64_t slot) {
  if (second < 0 || (slot >= 0 && t.digest(slot) == p.digest)) return slot;
  const int64_t s = likely_slot<CpuPlatform>(t, second, p.digest, p.order, kLineGroups);
  if (s < 0 || t.digest(s) != p.digest) return slot;
  CpuPlatform::prefetch(t.keys + s);
  if (kRows == RowUse::kAll || kRows == RowUse::kHitsOnly) {
    CpuPlatform::prefetch_lines(t.row(s), t.row_width * static_cast<int64_t>(sizeof(V)));
  }
  return s;
}

/// Stage 1 of a key whose slot the caller knows (prefetched_loop's known_at): what a
/// hit's body touches there, as stage 2 fetches it for a likely slot.
template <Touches kTouches, RowUse kRows, class V>
DYNEMB_INLINE void prefetch_known_slot(const TableRef<V>& t, int64_t slot) {
  if (kTouches != Touches::kRead) {
    if (t.scores) CpuPlatform::prefetch_for_write(t.scores + slot);
    if (t.timestamps) CpuPlatform::prefetch_for_write(t.timestamps + slot);
    if (t.pins) CpuPlatform::prefetch_for_write(t.pins + slot);
  }
  if (kRows == RowUse::kAll || kRows == RowUse::kHitsOnly) {
    CpuPlatform::prefetch_lines(t.row(slot), t.row_width * static_cast<int64_t>(sizeof(V)));
  }
}

}  // namespace detail

/// prefetched_loop's default known_at: no key's slot is known.
struct NoKnownSlots {
  int64_t operator()(int64_t) const { return -1; }
};

/// Calls body(j, hint) for j in [begin, end) in order, prefetching group by group
/// (kGroup keys per group); key_at(j) is the key body(j) will look up (or its
/// KeyProbe, when the bucket to look in is not its home: a NO_EVICTION upsert's chosen
/// bucket) and hint its likely slot (or -1). A body that takes a third argument gets
/// the key's KeyProbe too: each key is hashed once, in stage 1.
/// kSeconds (finds by key in a table whose keys may sit in their second bucket): past a
/// flagged home, stage 1 also fetches the second bucket's home line, and stage 2 that
/// bucket's likely slot when the home line has no match.
/// known_at(j): the slot that holds j's key when the caller knows it (pass 0 found it
/// stored), else -1; such a key is not probed: stage 1 fetches what a hit touches in
/// that slot, and the body gets the slot as its hint (and a KeyProbe not computed).
template <Touches kTouches, RowUse kRows, int64_t kGroup, bool kVictims = true,
          bool kSeconds = false, class V, class KeyAt, class Body,
          class KnownAt = NoKnownSlots>
DYNEMB_INLINE void prefetched_loop(const TableRef<V>& t, int64_t begin, int64_t end,
                                   KeyAt&& key_at, Body&& body, KnownAt&& known_at = {}) {
  // Entry (j - begin) % kRing of each ring: j's probe (and second bucket) from stage 1
  // and hint from stage 2; stage 1 runs two groups ahead of the body, stage 2 one
  // group. Four groups, not three: a power of two makes the modulo a mask (kGroup is one).
  constexpr int64_t kRing = 4 * kGroup;
  static_assert((kGroup & (kGroup - 1)) == 0, "kGroup must be a power of two");
  constexpr bool kKnown = !std::is_same_v<std::decay_t<KnownAt>, NoKnownSlots>;
  KeyProbe probes[kRing];
  int64_t hints[kRing];
  int64_t known[kKnown ? kRing : 1];
  int64_t seconds[kSeconds ? kRing : 1];
  BucketSpan span;
  auto digests = [&](int64_t from) {
    for (int64_t j = from; j < std::min(end, from + kGroup); ++j) {
      const int64_t r = (j - begin) % kRing;
      if constexpr (kKnown) {
        known[r] = known_at(j);
        if (known[r] >= 0) {
          detail::prefetch_known_slot<kTouches, kRows>(t, known[r]);
          continue;
        }
      }
      KeyProbe& p = probes[r];
      if constexpr (std::is_same_v<std::decay_t<decltype(key_at(j))>, KeyProbe>) {
        p = key_at(j);
        if constexpr (kSeconds) seconds[r] = -1;  // a chosen bucket: no second to look in
      } else if constexpr (kSeconds) {
        const uint64_t h = hash_key(key_at(j));
        p = KeyProbe::of_hash(t, h);
        seconds[r] = t.overflowed(p.bucket) ? second_bucket_of(h, t.num_buckets) : -1;
        if (seconds[r] >= 0) {
          CpuPlatform::prefetch(t.digests + seconds[r] * t.bucket_capacity + 16 * p.order.home);
        }
      } else {
        p = KeyProbe(t, key_at(j));
      }
      detail::prefetch_digests(t, p, span);
    }
  };
  auto slots = [&](int64_t from) {
    for (int64_t j = from; j < std::min(end, from + kGroup); ++j) {
      const int64_t r = (j - begin) % kRing;
      if constexpr (kKnown) {
        if (known[r] >= 0) {
          hints[r] = known[r];
          continue;
        }
      }
      hints[r] = detail::prefetch_slot<kTouches, kRows, kVictims>(t, probes[r], span);
      if constexpr (kSeconds) {
        hints[r] = detail::prefetch_second_slot<kRows>(t, probes[r], seconds[r], hints[r]);
      }
    }
  };
  digests(begin);
  digests(begin + kGroup);
  slots(begin);
  for (int64_t g = begin; g < end; g += kGroup) {
    digests(g + 2 * kGroup);
    slots(g + kGroup);
    for (int64_t j = g; j < std::min(end, g + kGroup); ++j) {
      const int64_t r = (j - begin) % kRing;
      if constexpr (std::is_invocable_v<Body&, int64_t, int64_t, const KeyProbe&>) {
        body(j, hints[r], probes[r]);
      } else {
        body(j, hints[r]);
      }
    }
  }
}

}  // namespace dynemb::cpu
