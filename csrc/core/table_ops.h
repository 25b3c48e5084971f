// dynemb core: THE per-key table algorithm (find, upsert, erase, move): its rules, and
// the decisions every op shares (touch, claim, where a new key goes).
//
// The ops themselves are written once, for a tile of lanes (bucket_tile.h): the scans
// of a bucket in bucket_tile.h, an upsert's per-key ops in tile_ops.h, erase in
// tile_erase.h, rehash in tile_rehash.h. Every executor calls them once per key (the
// CPU with the one lane of a SerialTile, CUDA with a warp tile); they decide
// everything: which bucket, which slot, whether to evict and whom, what the scores
// become. What happens to value rows is delegated to a Sink (batch_sinks.h), called
// by the tile that owns the key's bucket:
//
//   sink.hit(i, o, slot)              key i found at slot
//   sink.evicting(i, slot)            slot's resident is about to be replaced
//   sink.fresh(i, o, slot, key)       key i now owns slot (new row)
//   sink.failed(i, o, key)            key i could not be stored
//
// i indexes the batch's inputs; o is where the key's small per-key outputs go (a
// slot, a status). Executors that process keys out of batch order pass their own
// position as o, so that each thread writes a contiguous range (no cache line
// shared between threads), and restore the batch order afterwards; others pass i.
//
// Placement. A key lives in its home bucket. Under NO_EVICTION it may also live in
// its second bucket (hash.h second_bucket_of, one of the 16 after its home): a new
// key takes the emptier of the two, and a key placed in its second bucket sets its
// home's overflow flag, so a find reads the second bucket only past a flagged home.
// Two choices fill a table to ~0.96 before it must grow (one bucket and a spill
// window of four: ~0.83; benchmark/placement_rules.cpp). Strategies that evict
// never spill: a full bucket evicts its minimum (score, digest, key) when that score is
// below the caller's eviction floor (UpsertArgs::evict_below), else reports the
// key as failed. The floor is 0 for a table still below max capacity (it grows
// instead of evicting), kEvictAny for a full table, and, for a cache tier, the
// oldest batch still in flight: residents scored with the number of a batch not
// yet through backward are pinned (dynemb/tiering/cached_table.py).
//
// Pins: no key evicts a key of its own batch, nor of a batch still in flight. Every
// slot an upsert finds or claims gets the batch's pin number (UpsertArgs::pin); a
// full bucket's victim must have a pin below UpsertArgs::pin_floor, which the owner
// sets to the oldest batch in flight (the batch itself, or a training forward whose
// backward has not run: it will write the gradients of its keys into their slots).
// So a lookup reads its own key's row and a gradient reaches only its key's row: a
// new key whose home bucket holds only pinned residents is reported as failed
// (sink.failed), it takes no one's slot. Pin numbers are the owner's
// (dynemb/table/pin_ledger.py); only evicting strategies keep pins.
//
// Batch rule (every executor, every device). A batch upsert runs in two passes, after
// a pass 0 under NO_EVICTION:
//   0. (NO_EVICTION, tables of two buckets or more) tile_choose_bucket for every key, which
//      reads and writes nothing else: the bucket where the key is stored, else the
//      emptier of its home and second bucket, as the table stood before the batch.
//      Pass 1 then runs each key in that bucket (KeyProbe::bucket), its "home" below:
//      a snapshot, so that owners of buckets decide alone, in any order, on a GPU too.
//      (Pass 1 moves and evicts no stored key under NO_EVICTION, so an executor may
//      take the slot where pass 0 found a key as its pass 1 hit: tile_hit_stored. In a
//      batch of distinct keys (UpsertArgs::distinct) no other key of the batch stores
//      a key pass 0 found absent, so its pass 1 may skip the find:
//      tile_place_new_chosen.)
//   1. for every key, the keys of one home bucket in batch order: under an evicting
//      strategy (hits_first) first a touch of every key of them that is stored, then
//      tile_upsert_home for those not stored (a key repeated in the batch is a hit the
//      second time), so that a hit is pinned before any newcomer looks for a victim,
//      wherever the two stand in the batch; under NO_EVICTION tile_upsert_home alone.
//      (The first of those runs as tile_touch_or_place_free: it also places the keys
//      that find a free home slot, as tile_upsert_home would, and leaves only those
//      that need a victim, with the same outcome in one probe; in a batch of distinct
//      keys (UpsertArgs::distinct) those go to tile_place_by_victim, without a second
//      probe.)
//      Pass 1 reads and writes the home bucket only (and sets the overflow flag of
//      the key's true home when the chosen bucket is its second), so buckets are
//      independent: any executor may run different buckets concurrently, without locks.
//   2. tile_upsert_spill for the keys pass 1 left (NO_EVICTION keys whose chosen bucket
//      filled), in batch order, one at a time: a hit in either bucket, else the first
//      of home and second bucket with a free slot, else (a restore: moves_residents) a
//      slot freed by moving one to three residents to their other bucket, else failed.
//      Where the window is one bucket (window_of: every evicting strategy, any table
//      of one bucket) it reads and writes the key's home bucket only (and moves no
//      resident), and pass 1 writes nothing there that it reads before it: an executor
//      that owns the bucket in pass 1 may run tile_upsert_spill there in the key's
//      place (tile_upsert_owned), with the same outcome and no pass 2.
// The outcome (slots, statuses, evictions, scores) is thus a function of the table
// and the batch alone, the same on a CPU with any thread count and on a GPU.
// Erase and rehash follow the same rule: tile_erase.h, per home bucket in batch order,
// then the keys that may sit in a second bucket; tile_rehash.h, tile_place_home, then
// tile_place_moved for what did not fit, in source-slot order.
//
// No locks. Every pass is run by owners of buckets (one tile serves every key of a
// bucket, one at a time), so no op takes a bucket lock.
#pragma once

#include "core/batch_sinks.h"
#include "core/bucket_tile.h"
#include "core/score_policy.h"

namespace dynemb {

struct UpsertArgs {
  ScoreArgs score;
  /// A full bucket evicts its minimum resident among those whose score (its
  /// pin_mask part) is < evict_below (kEvictAny: any); 0 never evicts (the key fails).
  uint64_t evict_below;
  /// The batch's pin number, written to the pin of every slot it finds or claims.
  uint32_t pin;
  /// Residents whose pin is >= pin_floor are not victims (kNoPins: none is pinned).
  uint32_t pin_floor;
  /// The caller's promise that the batch's keys are pairwise distinct (a de-duplicated
  /// batch): a key pass 1 finds neither stored nor with a free home slot goes straight
  /// to its victim search (tile_place_by_victim). A repeated key would then be stored twice.
  bool distinct = false;
};

/// The keys an upsert of n keys looks up when the caller gives their number on the
/// device (`live`, null: all n): the first min(max(*live, 0), n). A padded batch (its
/// distinct keys before their count was read) thus needs no read to size the call.
DYNEMB_HD DYNEMB_INLINE int64_t live_keys(const int64_t* live, int64_t n) {
  if (live == nullptr) return n;
  const int64_t m = *live;
  return m < 0 ? 0 : (m < n ? m : n);
}

/// Whether pass 1 touches every stored key of the batch (tile_touch_or_place_free) before it
/// places any new one (tile_upsert_home): every strategy that evicts, so that the
/// batch's hits are pinned before a newcomer looks for a victim.
DYNEMB_HD DYNEMB_INLINE bool hits_first(const UpsertArgs& u) { return evicts(u.score.strategy); }

/// Buckets a key may occupy: 1 (its home) under an evicting strategy or in a table
/// of one bucket, else 2 (its home and its second bucket).
template <class V>
DYNEMB_HD DYNEMB_INLINE int window_of(const TableRef<V>& t, ScoreStrategy s) {
  return evicts(s) || t.num_buckets < 2 ? 1 : kMaxProbeBuckets;
}

/// Whether a batch upsert runs pass 0 (tile_choose_bucket) before pass 1: when a key may
/// live in two buckets.
template <class V>
DYNEMB_HD DYNEMB_INLINE bool chooses_buckets(const TableRef<V>& t, const UpsertArgs& u) {
  return window_of(t, u.score.strategy) > 1;
}

/// The slot holding `key`, or -1 (bucket_tile.h tile_find_slot, by the one lane of a
/// SerialTile; no lock: see platform.h), with a guess (e.g. likely_slot computed earlier
/// to prefetch): when the guessed slot holds `key` it is the answer (a key occupies at
/// most one slot), otherwise the full walk runs.
template <class V>
DYNEMB_HD DYNEMB_INLINE int64_t find_slot_hinted(const TableRef<V>& t, int64_t key,
                                                 int64_t hint) {
  if (hint >= 0 && t.digest(hint) != kEmptyDigest && t.key(hint) == key) return hint;
  return tile_find_slot(SerialTile{}, t, key);
}

template <class V>
DYNEMB_HD DYNEMB_INLINE void touch(const TableRef<V>& t, int64_t slot, const UpsertArgs& u,
                                   int64_t i) {
  const ScoreArgs& a = u.score;
  if (t.has_scores()) t.set_score(slot, score_for_hit(a, i, t.score(slot)));
  if (t.has_timestamps()) t.set_timestamp(slot, a.batch_value);
  if (t.has_pins()) t.set_pin(slot, u.pin);
}

/// A claim's two halves, which a tile writes from different lanes (tile_claim): the
/// slot's identity (what the probe reads) and its entry metadata.
template <class V>
DYNEMB_HD DYNEMB_INLINE void claim_identity(const TableRef<V>& t, int64_t slot, int64_t key,
                                            uint8_t digest) {
  t.set_key(slot, key);
  t.set_digest(slot, digest);
}
template <class V>
DYNEMB_HD DYNEMB_INLINE void claim_metadata(const TableRef<V>& t, int64_t slot, uint64_t score,
                                            uint64_t timestamp, uint32_t pin) {
  if (t.has_scores()) t.set_score(slot, score);
  if (t.has_timestamps()) t.set_timestamp(slot, timestamp);
  if (t.has_pins()) t.set_pin(slot, pin);
}
template <class V>
DYNEMB_HD DYNEMB_INLINE void claim(const TableRef<V>& t, int64_t slot, int64_t key,
                                   uint8_t digest, uint64_t score, uint64_t timestamp,
                                   uint32_t pin) {
  claim_identity(t, slot, key, digest);
  claim_metadata(t, slot, score, timestamp, pin);
}

/// Sets the overflow flag of `key`'s home bucket when it was placed in `bucket`,
/// its second (see "Placement").
template <class V>
DYNEMB_HD DYNEMB_INLINE void flag_if_second(const TableRef<V>& t, int64_t key, int64_t bucket) {
  const int64_t home = bucket_of(hash_key(key), t.num_buckets);
  if (home != bucket) t.set_overflowed(home);
}

/// Whether a new key's home bucket, with `free` free slots, takes it in pass 0 without
/// a look at its second bucket: while the home is filled below 13/16. Keys then stay
/// home up to the loads a table spends most of its time at (a growth leaves ~0.74),
/// so fewer homes are flagged and fewer inserts read a second bucket: at 16M slots and
/// load 0.8 (count_upsert_cpu.py) inserts cost 0.70x, finds 0.71x, against the
/// emptier of the two for every key; the first failed insert comes at a load lower by
/// 0.002-0.015 (16M slots, batches of 2^14: 0.950 and 0.959 against 0.961 and 0.964;
/// a limit of 7/8 gave 0.944 and 0.953).
template <class V>
DYNEMB_HD DYNEMB_INLINE bool home_takes_new_keys(const TableRef<V>& t, int64_t free) {
  return free > t.bucket_capacity * 3 / 16;
}

}  // namespace dynemb
