// dynemb core: how a key's score changes when it is stored or accessed.
//
// The score decides eviction: in a full bucket the resident with the smallest
// (score, digest, key) is the victim (bucket.h); breaking ties by the key's digest,
// then the key, makes the choice deterministic and independent of slot positions. The batch value (a timestamp
// or a step) is read once per batch by the caller, so every key of one batch gets
// the same value and the algorithm never reads a device clock.
#pragma once

#include "core/decay.h"
#include "core/macros.h"

namespace dynemb {

/// Mirrors dynemb.DynamicEmbScoreStrategy (values are part of the op contract).
enum class ScoreStrategy : int64_t {
  kTimestamp = 0,     ///< score = batch timestamp (ns, monotonic)
  kStep = 1,          ///< score = batch step counter
  kCustomized = 2,    ///< score = caller's value; lower than every resident -> refused
  kLfu = 3,           ///< score = number of accesses
  kNoEviction = 4,    ///< no score; a full bucket means "grow the table"
  kTimestampLfu = 5,  ///< score = LFU count, plus the last-access timestamp beside it
  /// Internal, a cache tier's own score (dynemb/tiering/cached_table.py): the number
  /// of batches that looked the key up since it entered the cache (high 32 bits),
  /// then the latest such batch's number (low 32 bits, the part the eviction floor
  /// compares: see pin_mask). So an unpinned resident used least often leaves
  /// first, the older among equals.
  kCache = 6,
  /// score = the time-decayed access count, as L = step + half_life * log2(count)
  /// in units of 2^-16 step (core/decay.h); ScoreArgs::half_life and decay_step.
  kDecayedLfu = 7,
  kTimestampDecayedLfu = 8,  ///< DECAYED_LFU, plus the last-access timestamp beside it
};

/// Number of ScoreStrategy values, and their names by code (DynamicEmbScoreStrategy
/// member names; exported to Python: dynemb._ops.SCORE_STRATEGY_CODES).
constexpr int64_t kScoreStrategyCount =
    static_cast<int64_t>(ScoreStrategy::kTimestampDecayedLfu) + 1;
constexpr const char* kScoreStrategyNames[kScoreStrategyCount] = {
    "TIMESTAMP", "STEP",  "CUSTOMIZED",  "LFU", "NO_EVICTION", "TIMESTAMP_LFU",
    "CACHE",     "DECAYED_LFU", "TIMESTAMP_DECAYED_LFU"};

/// What a batch's ScoreArgs::batch_value is under each strategy: the host clock
/// (TIMESTAMP scores: monotonic ns), the table's step count (STEP), the cache tier's
/// batch number (kCache), or unused. Hosts pick the value by this rule alone.
enum class BatchValueSource : int64_t { kUnused = 0, kClock = 1, kStep = 2, kBatchNumber = 3 };
constexpr const char* kBatchValueSourceNames[] = {"unused", "clock", "step", "batch_number"};

DYNEMB_HD DYNEMB_INLINE BatchValueSource batch_value_source(ScoreStrategy s) {
  switch (s) {
    case ScoreStrategy::kTimestamp:
    case ScoreStrategy::kTimestampLfu:
    case ScoreStrategy::kTimestampDecayedLfu: return BatchValueSource::kClock;
    case ScoreStrategy::kStep:
    case ScoreStrategy::kDecayedLfu: return BatchValueSource::kStep;
    case ScoreStrategy::kCache: return BatchValueSource::kBatchNumber;
    default: return BatchValueSource::kUnused;
  }
}

/// The highest score a count reaches: scores leave the table as int64 (get_scores,
/// export_batch, checkpoints), so a count saturates at INT64_MAX instead of wrapping to
/// a negative int64 that would rank the hottest key below every other.
constexpr uint64_t kMaxScore = 0x7FFFFFFFFFFFFFFFull;

/// `score + added`, saturated at kMaxScore (either operand may already exceed it).
DYNEMB_HD DYNEMB_INLINE uint64_t saturating_add(uint64_t score, uint64_t added) {
  if (score >= kMaxScore || added >= kMaxScore - score) return kMaxScore;
  return score + added;
}

/// evict_below value that lets any resident be evicted (UpsertArgs, table_ops.h).
constexpr uint64_t kEvictAny = ~uint64_t{0};

/// pin_floor value under which no slot is pinned (UpsertArgs, table_ops.h); pin
/// numbers are below it.
constexpr uint32_t kNoPins = 0xFFFFFFFFu;

/// kCache: the batch number's bits, and the most uses counted (saturates).
constexpr uint64_t kCacheBatchMask = 0xFFFFFFFFu;
constexpr uint64_t kCacheMaxUses = 0x7FFFFFFFu;

/// The part of a score the eviction floor (UpsertArgs::evict_below) compares: a
/// cache tier's batch number, else the whole score.
DYNEMB_HD DYNEMB_INLINE uint64_t pin_mask(ScoreStrategy s) {
  return s == ScoreStrategy::kCache ? kCacheBatchMask : ~uint64_t{0};
}

/// One batch's scoring context.
struct ScoreArgs {
  ScoreStrategy strategy;
  uint64_t batch_value;       // timestamp or step of this batch
  const int64_t* custom;      // (n) caller scores, CUSTOMIZED only; may be null on a pure find
  const int64_t* increments;  // (n) accesses each key stands for (a de-duplicated batch), or null: 1
  uint64_t half_life = 0;      // DECAYED_LFU strategies: steps, in [1, kMaxHalfLife]
  uint64_t decay_step = 0;     // DECAYED_LFU strategies: the batch's step, <= kMaxDecayStep
};

/// The strategies whose score is a decayed count (core/decay.h).
DYNEMB_HD DYNEMB_INLINE bool decays(ScoreStrategy s) {
  return s == ScoreStrategy::kDecayedLfu || s == ScoreStrategy::kTimestampDecayedLfu;
}

DYNEMB_HD DYNEMB_INLINE uint64_t accesses(const ScoreArgs& a, int64_t i) {
  return a.increments ? static_cast<uint64_t>(a.increments[i]) : 1;
}

DYNEMB_HD DYNEMB_INLINE bool evicts(ScoreStrategy s) { return s != ScoreStrategy::kNoEviction; }
DYNEMB_HD DYNEMB_INLINE bool keeps_scores(ScoreStrategy s) { return s != ScoreStrategy::kNoEviction; }
DYNEMB_HD DYNEMB_INLINE bool keeps_timestamps(ScoreStrategy s) {
  return s == ScoreStrategy::kTimestampLfu || s == ScoreStrategy::kTimestampDecayedLfu;
}

/// Score of a key stored by this batch (element i of the batch).
DYNEMB_HD DYNEMB_INLINE uint64_t score_for_new(const ScoreArgs& a, int64_t i) {
  switch (a.strategy) {
    case ScoreStrategy::kCustomized: return static_cast<uint64_t>(a.custom[i]);
    case ScoreStrategy::kLfu:
    case ScoreStrategy::kTimestampLfu: return saturating_add(0, accesses(a, i));
    case ScoreStrategy::kCache: return uint64_t{1} << 32 | a.batch_value;
    case ScoreStrategy::kDecayedLfu:
    case ScoreStrategy::kTimestampDecayedLfu: {  // no access (a 0 count) weighs nothing
      const uint64_t c = accesses(a, i);
      return c ? decayed_access(a.decay_step, c, a.half_life) : 0;
    }
    default: return a.batch_value;
  }
}

/// Score of a stored key accessed again by this batch; `old` is its current score.
DYNEMB_HD DYNEMB_INLINE uint64_t score_for_hit(const ScoreArgs& a, int64_t i, uint64_t old) {
  switch (a.strategy) {
    case ScoreStrategy::kCustomized: return static_cast<uint64_t>(a.custom[i]);
    case ScoreStrategy::kLfu:
    case ScoreStrategy::kTimestampLfu: return saturating_add(old, accesses(a, i));
    case ScoreStrategy::kCache: {  // one more use per later batch
      if (a.batch_value <= (old & kCacheBatchMask)) return old;
      const uint64_t uses = old >> 32;
      return (uses + (uses < kCacheMaxUses)) << 32 | a.batch_value;
    }
    case ScoreStrategy::kDecayedLfu:
    case ScoreStrategy::kTimestampDecayedLfu: {
      const uint64_t c = accesses(a, i);
      return c ? decayed_merge(old, decayed_access(a.decay_step, c, a.half_life), a.half_life)
               : old;
    }
    default: return a.batch_value > old ? a.batch_value : old;
  }
}

/// A cache tier's score of a row after a batch's hit; `old` 0 is a key new to the table
/// (for the other strategies score_for_hit of 0 is score_for_new already; a decayed
/// count's 0 weighs nothing, which decayed_merge does not know).
DYNEMB_HD DYNEMB_INLINE uint64_t score_after_tier_hit(const ScoreArgs& a, int64_t i,
                                                      uint64_t old) {
  return old == 0 ? score_for_new(a, i) : score_for_hit(a, i, old);
}

/// CUSTOMIZED refuses a newcomer whose score is below every resident's.
DYNEMB_HD DYNEMB_INLINE bool admits(ScoreStrategy s, uint64_t new_score, uint64_t victim_score) {
  return s != ScoreStrategy::kCustomized || new_score >= victim_score;
}

}  // namespace dynemb
