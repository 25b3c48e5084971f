// dynemb core: THE per-key table algorithm (find, upsert, erase, move).
//
// Every executor (CPU loops, CUDA kernels) calls these functions once per key;
// they decide everything: which bucket, which slot, whether to evict and whom,
// what the scores become. What happens to value rows is delegated to a Sink
// (batch_sinks.h), called while the bucket lock is held:
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
//   0. (NO_EVICTION, tables of two buckets or more) choose_bucket for every key, which
//      reads and writes nothing else: the bucket where the key is stored, else the
//      emptier of its home and second bucket, as the table stood before the batch.
//      Pass 1 then runs each key in that bucket (KeyProbe::bucket), its "home" below:
//      a snapshot, so that owners of buckets decide alone, in any order, on a GPU too.
//      (Pass 1 moves and evicts no stored key under NO_EVICTION, so an executor may
//      take the slot where pass 0 found a key as its pass 1 hit: hit_stored. In a
//      batch of distinct keys (UpsertArgs::distinct) no other key of the batch stores
//      a key pass 0 found absent, so its pass 1 may skip the find: place_new_chosen.)
//   1. for every key, the keys of one home bucket in batch order: under an evicting
//      strategy (hits_first) touch_stored for all of them, then upsert_home for
//      those not stored (a key repeated in the batch is a hit the second time), so
//      that a hit is pinned before any newcomer looks for a victim, wherever the
//      two stand in the batch; under NO_EVICTION upsert_home alone. (An executor
//      may run touch_or_place_free instead of touch_stored: it also places the keys
//      that find a free home slot, as upsert_home would, and leaves only those that
//      need a victim, with the same outcome in one probe; in a batch of distinct keys
//      (UpsertArgs::distinct) those go to place_by_victim, without upsert_home's second
//      probe.)
//      Pass 1 reads and writes the home bucket only (and sets the overflow flag of
//      the key's true home when the chosen bucket is its second), so buckets are
//      independent: any executor may run different buckets concurrently, without locks.
//   2. upsert_spill for the keys pass 1 left (NO_EVICTION keys whose chosen bucket
//      filled), in batch order, one at a time: a hit in either bucket, else the first
//      of home and second bucket with a free slot, else failed. Where the window is
//      one bucket (window_of: every evicting strategy, any table of one bucket) it
//      reads and writes the key's home bucket only, and pass 1 writes nothing there
//      that it reads before it: an executor that owns the bucket in pass 1 may run
//      upsert_spill there in the key's place (tile_ops.h tile_upsert_owned), with
//      the same outcome and no pass 2.
// The outcome (slots, statuses, evictions, scores) is thus a function of the table
// and the batch alone, the same on a CPU with any thread count and on a GPU.
// Erase and rehash follow the same rule, each written once for a tile of lanes (the
// CPU's is a SerialTile): tile_erase.h, per home bucket in batch order, then the keys
// that may sit in a second bucket; tile_rehash.h, tile_place_home, then
// tile_place_moved for what did not fit, in source-slot order.
//
// Locking. The Platform's bucket locks guard executors that run keys of one bucket
// concurrently anyway: upsert_home takes the home bucket's lock, upsert_spill the
// locks of both buckets in ascending index order (deadlock-free).
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
  /// to its victim search (place_by_victim). A repeated key would then be stored twice.
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

/// Whether pass 1 touches every stored key of the batch (touch_stored) before it
/// places any new one (upsert_home): every strategy that evicts, so that the
/// batch's hits are pinned before a newcomer looks for a victim.
DYNEMB_HD DYNEMB_INLINE bool hits_first(const UpsertArgs& u) { return evicts(u.score.strategy); }

/// Buckets a key may occupy: 1 (its home) under an evicting strategy or in a table
/// of one bucket, else 2 (its home and its second bucket).
template <class V>
DYNEMB_HD DYNEMB_INLINE int window_of(const TableRef<V>& t, ScoreStrategy s) {
  return evicts(s) || t.num_buckets < 2 ? 1 : kMaxProbeBuckets;
}

/// Whether a batch upsert runs pass 0 (choose_bucket) before pass 1: when a key may
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

/// Locks (or unlocks) bucket `a` and, when >= 0, bucket `b`, in ascending index order.
template <class P, class V>
DYNEMB_HD void lock_pair(const TableRef<V>& t, int64_t a, int64_t b, bool lock) {
  const int64_t first = b >= 0 && b < a ? b : a;
  const int64_t last = b >= 0 && b > a ? b : a;
  lock ? P::lock(t.lock_word(first)) : P::unlock(t.lock_word(first));
  if (last != first) lock ? P::lock(t.lock_word(last)) : P::unlock(t.lock_word(last));
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

/// Pass 0 of a batch upsert under NO_EVICTION (chooses_buckets; see "Batch rule"):
/// the bucket whose owner decides `key` in pass 1: the one that stores it, else its
/// home while home_takes_new_keys, else the emptier of its home and second bucket
/// (ties: home). Reads only. `p`: KeyProbe(t, key); `hint`: a slot that likely holds
/// the key, or -1 (decides nothing). tile_ops.h tile_choose_bucket is the same for a
/// tile of lanes; this one takes the CPU's hint (the executor parity tests hold them
/// equal).
/// Keeping a new key home unless its second bucket had a margin more free slots made
/// finds cheaper but the first failed insert earlier (buckets of 128: margins 0, 1, 2, 8
/// gave 3.4, 2.9, 2.7, 2.35 metadata lines a find at load 0.75, and loads 0.959, 0.951,
/// 0.942, ~0.92 at 16M slots).
/// `stored` (when not null) receives the slot that stores the key, else -1: pass 1
/// moves and evicts no stored key under NO_EVICTION, so an executor may take that slot
/// as the key's hit there without a second probe (hit_stored).
template <class V>
DYNEMB_HD int64_t choose_bucket(const TableRef<V>& t, int64_t key, const KeyProbe& p,
                                int64_t hint = -1, int64_t* stored = nullptr) {
  const SerialTile one;
  int64_t slot = -1;
  if (hint >= 0 && t.digest(hint) == p.digest && t.key(hint) == key) slot = hint;
  const int64_t home = p.bucket;
  if (slot < 0) slot = tile_bucket_find(one, t, home, key, p.digest, p.order.home);
  const uint64_t h = hash_key(key);
  const int64_t second = second_bucket_of(h, t.num_buckets);
  if (slot < 0 && t.overflowed(home)) {
    slot = tile_bucket_find(one, t, second, key, p.digest, p.order.home);
  }
  if (stored != nullptr) *stored = slot;
  if (slot >= 0) return slot / t.bucket_capacity;
  const int64_t home_free = tile_free_count(one, t, home);
  if (home_takes_new_keys(t, home_free)) return home;
  return tile_free_count(one, t, second) > home_free ? second : home;
}

/// The slot of `key` in its home bucket, or -1; `hint` (a likely slot, or -1) saves
/// the scan when it holds the key (a key has one slot at most).
template <class V>
DYNEMB_HD DYNEMB_INLINE int64_t home_slot(const TableRef<V>& t, int64_t home, int64_t key,
                                          uint8_t digest, const ProbeOrder& order,
                                          int64_t hint) {
  if (hint >= 0 && t.digest(hint) == digest && t.key(hint) == key) return hint;
  return tile_bucket_find(SerialTile{}, t, home, key, digest, order.home);
}

/// The eviction step of place_new_home: key i takes `victim`, its full home bucket's
/// tile_victim (-1: none), when the strategy admits it there, else fails. Calls
/// sink.evicting and sink.fresh, or sink.failed; returns the status.
template <class V, class Sink>
DYNEMB_HD DYNEMB_INLINE Status place_at_victim(const TableRef<V>& t, int64_t i, int64_t o,
                                               int64_t key, const KeyProbe& p,
                                               const UpsertArgs& u, Sink& sink,
                                               int64_t victim) {
  const ScoreArgs& a = u.score;
  const uint64_t score = score_for_new(a, i);
  if (victim >= 0 && admits(a.strategy, score, t.score(victim))) {
    sink.evicting(i, victim);
    claim(t, victim, key, p.digest, score, a.batch_value, u.pin);
    sink.fresh(i, o, victim, key);
    return Status::kEvicted;
  }
  sink.failed(i, o, key);
  return Status::kFailed;
}

/// Places key i, known not to be stored, in its home bucket (the caller holds the
/// bucket's lock): `slot`, the bucket's first free slot (tile_free_slot), else
/// (slot -1, evicting strategies) the bucket's victim (tile_victim: not pinned,
/// below the eviction floor), else it fails. Calls sink.fresh (after sink.evicting
/// for a victim) or sink.failed; returns the status.
template <class P, class V, class Sink>
DYNEMB_HD DYNEMB_INLINE Status place_new_home(const TableRef<V>& t, int64_t i, int64_t o,
                                              int64_t key, const KeyProbe& p,
                                              const UpsertArgs& u, Sink& sink, int64_t slot) {
  const ScoreArgs& a = u.score;
  if (slot >= 0) {
    claim(t, slot, key, p.digest, score_for_new(a, i), a.batch_value, u.pin);
    sink.fresh(i, o, slot, key);
    return Status::kInserted;
  }
  const int64_t victim = tile_victim(SerialTile{}, t, p.bucket, pin_mask(a.strategy),
                                     u.evict_below, u.pin_floor);
  return place_at_victim(t, i, o, key, p, u, sink, victim);
}

/// Pass 1 of a batch upsert under NO_EVICTION (see "Batch rule" above): decides key
/// i when bucket p.bucket alone can (a hit there, or a free slot there), calling
/// exactly one of sink.hit / sink.fresh / sink.failed and setting *status. Returns
/// false, having changed nothing, for a key that needs its second bucket: upsert_spill
/// decides it in pass 2. Under an evicting strategy executors run it after
/// touch_stored (hits_first).
/// kChosen: p.bucket is choose_bucket's answer (pass 0 ran), which already looked for
/// the key in both buckets; else p.bucket is the key's home, and a flagged home (the
/// key may be in its second bucket) leaves the key to pass 2.
/// `hint`: a slot that likely holds the key (likely_slot, computed to prefetch), or
/// -1; it saves the bucket scan of a hit and decides nothing (a key has one slot at most).
/// `p`: KeyProbe(t, key), computed by the caller (its bucket maybe replaced).
template <class P, bool kChosen = false, class V, class Sink>
DYNEMB_HD bool upsert_home(const TableRef<V>& t, int64_t i, int64_t o, int64_t key,
                           const KeyProbe& p, const UpsertArgs& u, Sink& sink, Status* status,
                           int64_t hint = -1) {
  const int64_t home = p.bucket;
  if (!kChosen && t.overflowed(home)) return false;
  P::lock(t.lock_word(home));
  bool decided = false;
  const int64_t slot = home_slot(t, home, key, p.digest, p.order, hint);
  if (slot >= 0) {
    touch(t, slot, u, i);
    sink.hit(i, o, slot);
    *status = Status::kHit;
    decided = true;
  } else {
    const int64_t free = tile_free_slot(SerialTile{}, t, home, p.order);
    if (free >= 0 || evicts(u.score.strategy)) {
      *status = place_new_home<P>(t, i, o, key, p, u, sink, free);
      if (free >= 0 && !evicts(u.score.strategy)) flag_if_second(t, key, home);
      decided = true;
    }
  }
  P::unlock(t.lock_word(home));
  return decided;
}

/// Pass 1 of a key that pass 0 found stored in `slot` (choose_bucket's `stored`): the
/// hit upsert_home would make in its chosen bucket, without the probe that would find
/// the same slot again. Calls sink.hit.
template <class V, class Sink>
DYNEMB_HD DYNEMB_INLINE Status hit_stored(const TableRef<V>& t, int64_t i, int64_t o, int64_t slot,
                                          const UpsertArgs& u, Sink& sink) {
  touch(t, slot, u, i);
  sink.hit(i, o, slot);
  return Status::kHit;
}

/// Pass 1 of a key of a distinct batch (UpsertArgs::distinct) that pass 0 found stored
/// in neither of its buckets: upsert_home<kChosen>'s outcome without its find, which
/// would find nothing (no other key of the batch is this key, and pass 1 moves no
/// stored key): the chosen bucket p.bucket's first free slot (flagging the key's home
/// when it is its second bucket), else false, having changed nothing (pass 2 decides).
/// NO_EVICTION only (it runs pass 0). Calls sink.fresh when it places the key.
template <class P, class V, class Sink>
DYNEMB_HD bool place_new_chosen(const TableRef<V>& t, int64_t i, int64_t o, int64_t key,
                                const KeyProbe& p, const UpsertArgs& u, Sink& sink,
                                Status* status) {
  P::lock(t.lock_word(p.bucket));
  const int64_t free = tile_free_slot(SerialTile{}, t, p.bucket, p.order);
  if (free >= 0) {
    *status = place_new_home<P>(t, i, o, key, p, u, sink, free);
    flag_if_second(t, key, p.bucket);
  }
  P::unlock(t.lock_word(p.bucket));
  return free >= 0;
}

/// upsert_home of a key whose KeyProbe is not at hand.
template <class P, class V, class Sink>
DYNEMB_HD bool upsert_home(const TableRef<V>& t, int64_t i, int64_t o, int64_t key,
                           const UpsertArgs& u, Sink& sink, Status* status, int64_t hint = -1) {
  return upsert_home<P>(t, i, o, key, KeyProbe(t, key), u, sink, status, hint);
}

/// Pass 2 of a batch upsert: key i, left by upsert_home: a hit in its home bucket or
/// (a flagged home) its second, else the first of the two with a free slot (a key
/// placed in its second bucket flags its home), else failed. Calls exactly one sink
/// function.
template <class P, class V, class Sink>
DYNEMB_HD Status upsert_spill(const TableRef<V>& t, int64_t i, int64_t o, int64_t key,
                              const UpsertArgs& u, Sink& sink) {
  const uint64_t h = hash_key(key);
  const uint8_t digest = digest_of(h);
  const ProbeOrder order(h, t.bucket_capacity);
  const int64_t home = bucket_of(h, t.num_buckets);
  const ScoreArgs& a = u.score;
  const int64_t second = window_of(t, a.strategy) > 1 ? second_bucket_of(h, t.num_buckets) : -1;
  lock_pair<P>(t, home, second, true);
  Status status = Status::kFailed;
  int64_t found = tile_bucket_find(SerialTile{}, t, home, key, digest, order.home);
  if (found < 0 && second >= 0 && t.overflowed(home)) {
    found = tile_bucket_find(SerialTile{}, t, second, key, digest, order.home);
  }
  if (found >= 0) {
    touch(t, found, u, i);
    sink.hit(i, o, found);
    status = Status::kHit;
  } else {
    int64_t slot = tile_free_slot(SerialTile{}, t, home, order);
    if (slot < 0 && second >= 0) {
      slot = tile_free_slot(SerialTile{}, t, second, order);
      if (slot >= 0) t.set_overflowed(home);
    }
    if (slot >= 0) {
      claim(t, slot, key, digest, score_for_new(a, i), a.batch_value, u.pin);
      sink.fresh(i, o, slot, key);
      status = Status::kInserted;
    } else {
      sink.failed(i, o, key);
    }
  }
  lock_pair<P>(t, home, second, false);
  return status;
}

/// upsert_home of a key of a distinct batch (UpsertArgs::distinct) that
/// touch_or_place_free left, in one step: the key is not stored (pass 1 found it
/// absent, and no other key of the batch is it) and its home bucket has no free slot
/// (pass 1 found none, and an upsert frees none), so upsert_home's scans for both
/// would only confirm that; the outcome is its: the bucket's victim or failed.
template <class P, class V, class Sink>
DYNEMB_HD DYNEMB_INLINE Status place_by_victim(const TableRef<V>& t, int64_t i, int64_t o,
                                               int64_t key, const KeyProbe& p,
                                               const UpsertArgs& u, Sink& sink) {
  P::lock(t.lock_word(p.bucket));
  const Status status = place_new_home<P>(t, i, o, key, p, u, sink, -1);
  P::unlock(t.lock_word(p.bucket));
  return status;
}

/// Pass 1 of a hits-first batch (hits_first): when `key` is stored it is touched
/// (its score, and its pin: see "Pins") and reported (sink.hit) as upsert would, and
/// upsert_home must then not run for it. Evicting strategies only: their keys live
/// in their home bucket.
/// @return true when the key was stored.
template <class P, class V, class Sink>
DYNEMB_HD bool touch_stored(const TableRef<V>& t, int64_t i, int64_t o, int64_t key,
                            const UpsertArgs& u, Sink& sink, int64_t hint = -1) {
  const uint64_t h = hash_key(key);
  const uint8_t digest = digest_of(h);
  const ProbeOrder order(h, t.bucket_capacity);
  const int64_t home = bucket_of(h, t.num_buckets);
  P::lock(t.lock_word(home));
  const int64_t slot = home_slot(t, home, key, digest, order, hint);
  if (slot >= 0) {
    touch(t, slot, u, i);
    sink.hit(i, o, slot);
  }
  P::unlock(t.lock_word(home));
  return slot >= 0;
}

/// Pass 1 of a hits-first batch in one probe where one is enough: a stored key is
/// touched and reported (touch_stored), *status kHit; a key not stored whose home
/// bucket has a free slot takes it (place_new_home), *status kInserted. That is what
/// upsert_home gives it after every touch of the pass: touches write no digest, so the
/// free slots, and the order the bucket's new keys take them in, are the same. Only a
/// key whose home bucket is full (or has overflowed) needs the bucket's hits pinned
/// before it looks for a victim: returns false for it, having changed nothing, and
/// upsert_home decides it after the pass. Evicting strategies only (hits_first).
template <class P, class V, class Sink>
DYNEMB_HD bool touch_or_place_free(const TableRef<V>& t, int64_t i, int64_t o, int64_t key,
                                   const KeyProbe& p, const UpsertArgs& u, Sink& sink,
                                   Status* status, int64_t hint = -1) {
  const int64_t home = p.bucket;
  P::lock(t.lock_word(home));
  bool decided = false;
  const int64_t slot = home_slot(t, home, key, p.digest, p.order, hint);
  if (slot >= 0) {
    touch(t, slot, u, i);
    sink.hit(i, o, slot);
    *status = Status::kHit;
    decided = true;
  } else if (!t.overflowed(home)) {
    const int64_t free = tile_free_slot(SerialTile{}, t, home, p.order);
    if (free >= 0) {
      *status = place_new_home<P>(t, i, o, key, p, u, sink, free);
      decided = true;
    }
  }
  P::unlock(t.lock_word(home));
  return decided;
}

}  // namespace dynemb
