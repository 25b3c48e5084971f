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
// Placement. A key lives in its home bucket. Under NO_EVICTION a full home
// bucket spills into the next buckets of a window of kMaxProbeBuckets; every
// bucket passed gets its overflow flag, so a find walks on only past flagged
// buckets and a table fills to ~90% before it must grow. Strategies that evict
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
// Batch rule (every executor, every device). A batch upsert runs in two passes:
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
//      Pass 1 reads and writes the home bucket only, so buckets are independent:
//      any executor may run different buckets concurrently, without locks.
//   2. upsert_spill for the keys pass 1 left (NO_EVICTION keys whose home bucket is
//      full or has overflowed), in batch order, one at a time. Where the window is
//      one bucket (window_of: every evicting strategy, any table of one bucket) it
//      reads and writes the key's home bucket only, and pass 1 writes nothing there
//      that it reads before it: an executor that owns the bucket in pass 1 may run
//      upsert_spill there in the key's place (tile_ops.h tile_upsert_owned), with
//      the same outcome and no pass 2.
// The outcome (slots, statuses, evictions, scores) is thus a function of the table
// and the batch alone, the same on a CPU with any thread count and on a GPU.
// Erase and rehash follow the same rule (erase_key per home bucket in batch order;
// place_home, then place_moved for what did not fit, in source-slot order).
//
// Locking. The Platform's bucket locks guard executors that run keys of one bucket
// concurrently anyway: upsert_home takes the home bucket's lock, upsert_spill the
// locks of its whole window in ascending index order (deadlock-free), erase_key the
// lock of each bucket it scans, one at a time.
#pragma once

#include "core/bucket.h"
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

template <class V>
DYNEMB_HD DYNEMB_INLINE int window_of(const TableRef<V>& t, ScoreStrategy s) {
  if (evicts(s)) return 1;
  return t.num_buckets < kMaxProbeBuckets ? static_cast<int>(t.num_buckets) : kMaxProbeBuckets;
}

/// @return the slot holding `key`, or -1. Takes no lock (see platform.h).
template <class P, class V>
DYNEMB_HD int64_t find_slot(const TableRef<V>& t, int64_t key) {
  const uint64_t h = hash_key(key);
  const uint8_t digest = digest_of(h);
  const ProbeOrder order(h, t.bucket_capacity);
  int64_t b = bucket_of(h, t.num_buckets);
  const int walk = t.num_buckets < kMaxProbeBuckets ? static_cast<int>(t.num_buckets)
                                                    : kMaxProbeBuckets;
  for (int k = 0; k < walk; ++k) {
    const int64_t slot = bucket_find<P>(t, b, key, digest, order);
    if (slot >= 0 || !t.overflowed(b)) return slot;
    b = t.next_bucket(b);
  }
  return -1;
}

/// find_slot with a guess (e.g. likely_slot computed earlier to prefetch): when the
/// guessed slot holds `key` it is the answer (a key occupies at most one slot),
/// otherwise the full walk runs.
template <class P, class V>
DYNEMB_HD DYNEMB_INLINE int64_t find_slot_hinted(const TableRef<V>& t, int64_t key,
                                                 int64_t hint) {
  if (hint >= 0 && t.digest(hint) != kEmptyDigest && t.key(hint) == key) return hint;
  return find_slot<P>(t, key);
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

/// Locks (or unlocks) the `window` buckets starting at `home`, in ascending index order.
template <class P, class V>
DYNEMB_HD void lock_window(const TableRef<V>& t, int64_t home, int window, bool lock) {
  // Buckets past the end wrap to 0..: they have the smallest indices, so go first.
  const int64_t wrapped = home + window - t.num_buckets;  // count of wrapped buckets
  for (int64_t b = 0; b < wrapped; ++b) lock ? P::lock(t.lock_word(b)) : P::unlock(t.lock_word(b));
  const int64_t stop = wrapped > 0 ? t.num_buckets : home + window;
  for (int64_t b = home; b < stop; ++b) lock ? P::lock(t.lock_word(b)) : P::unlock(t.lock_word(b));
}

/// The slot of `key` in its home bucket, or -1; `hint` (a likely slot, or -1) saves
/// the scan when it holds the key (a key has one slot at most).
template <class P, class V>
DYNEMB_HD DYNEMB_INLINE int64_t home_slot(const TableRef<V>& t, int64_t home, int64_t key,
                                          uint8_t digest, const ProbeOrder& order,
                                          int64_t hint) {
  if (hint >= 0 && t.digest(hint) == digest && t.key(hint) == key) return hint;
  return bucket_find<P>(t, home, key, digest, order);
}

/// Places key i, known not to be stored, in its home bucket (the caller holds the
/// bucket's lock): `slot`, the bucket's first free slot (bucket_free_slot), else
/// (slot -1, evicting strategies) the bucket's victim (bucket_victim: not pinned,
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
  const int64_t victim = bucket_victim(t, p.bucket, pin_mask(a.strategy), u.evict_below,
                                       u.pin_floor);
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

/// Pass 1 of a batch upsert under NO_EVICTION (see "Batch rule" above): decides key
/// i when its home bucket alone can (a hit there, or a free slot there), calling
/// exactly one of sink.hit / sink.fresh / sink.failed and setting *status. Returns
/// false, having changed nothing, for a key that needs its spill window (a full or
/// overflowed home bucket): upsert_spill decides it in pass 2. Under an evicting
/// strategy executors run it after touch_stored (hits_first).
/// `hint`: a slot that likely holds the key (likely_slot, computed to prefetch), or
/// -1; it saves the bucket scan of a hit and decides nothing (a key has one slot at most).
/// `p`: KeyProbe(t, key), computed by the caller.
template <class P, class V, class Sink>
DYNEMB_HD bool upsert_home(const TableRef<V>& t, int64_t i, int64_t o, int64_t key,
                           const KeyProbe& p, const UpsertArgs& u, Sink& sink, Status* status,
                           int64_t hint = -1) {
  const int64_t home = p.bucket;
  P::lock(t.lock_word(home));
  bool decided = false;
  if (!t.overflowed(home)) {
    const int64_t slot = home_slot<P>(t, home, key, p.digest, p.order, hint);
    if (slot >= 0) {
      touch(t, slot, u, i);
      sink.hit(i, o, slot);
      *status = Status::kHit;
      decided = true;
    } else {
      const int64_t free = bucket_free_slot<P>(t, home, p.order);
      if (free >= 0 || evicts(u.score.strategy)) {
        *status = place_new_home<P>(t, i, o, key, p, u, sink, free);
        decided = true;
      }
    }
  }
  P::unlock(t.lock_word(home));
  return decided;
}

/// upsert_home of a key whose KeyProbe is not at hand.
template <class P, class V, class Sink>
DYNEMB_HD bool upsert_home(const TableRef<V>& t, int64_t i, int64_t o, int64_t key,
                           const UpsertArgs& u, Sink& sink, Status* status, int64_t hint = -1) {
  return upsert_home<P>(t, i, o, key, KeyProbe(t, key), u, sink, status, hint);
}

/// Pass 2 of a batch upsert: key i, left by upsert_home, walks its window: a hit in
/// any bucket of it, else the first free slot from home on (every full bucket passed
/// gets its overflow flag), else failed. Calls exactly one sink function.
template <class P, class V, class Sink>
DYNEMB_HD Status upsert_spill(const TableRef<V>& t, int64_t i, int64_t o, int64_t key,
                              const UpsertArgs& u, Sink& sink) {
  const uint64_t h = hash_key(key);
  const uint8_t digest = digest_of(h);
  const ProbeOrder order(h, t.bucket_capacity);
  const int64_t home = bucket_of(h, t.num_buckets);
  const ScoreArgs& a = u.score;
  const int window = window_of(t, a.strategy);
  lock_window<P>(t, home, window, true);
  Status status = Status::kFailed;
  int64_t b = home;
  int64_t found = -1;
  for (int k = 0; k < window; ++k) {
    found = bucket_find<P>(t, b, key, digest, order);
    if (found >= 0 || !t.overflowed(b)) break;
    b = t.next_bucket(b);
  }
  if (found >= 0) {
    touch(t, found, u, i);
    sink.hit(i, o, found);
    status = Status::kHit;
  } else {
    b = home;
    for (int k = 0; k < window; ++k) {
      const int64_t slot = bucket_free_slot<P>(t, b, order);
      if (slot >= 0) {
        claim(t, slot, key, digest, score_for_new(a, i), a.batch_value, u.pin);
        sink.fresh(i, o, slot, key);
        status = Status::kInserted;
        break;
      }
      t.set_overflowed(b);
      b = t.next_bucket(b);
    }
    if (status == Status::kFailed) sink.failed(i, o, key);
  }
  lock_window<P>(t, home, window, false);
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
  const int64_t slot = home_slot<P>(t, home, key, digest, order, hint);
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
  const int64_t slot = home_slot<P>(t, home, key, p.digest, p.order, hint);
  if (slot >= 0) {
    touch(t, slot, u, i);
    sink.hit(i, o, slot);
    *status = Status::kHit;
    decided = true;
  } else if (!t.overflowed(home)) {
    const int64_t free = bucket_free_slot<P>(t, home, p.order);
    if (free >= 0) {
      *status = place_new_home<P>(t, i, o, key, p, u, sink, free);
      decided = true;
    }
  }
  P::unlock(t.lock_word(home));
  return decided;
}

/// Removes `key`; @return true when it was stored. Holds one bucket lock at a time,
/// the one of the bucket it scans: an erase writes only its key's digest and never
/// moves a key or clears an overflow flag, so the chain it follows cannot change
/// under it. (Locking the whole window, as upsert_spill must, made the lanes of a
/// GPU warp, each erasing in its own home bucket, spin on their neighbours' windows:
/// 0.2 M erases/s on an H100.)
template <class P, class V>
DYNEMB_HD bool erase_key(const TableRef<V>& t, int64_t key) {
  const uint64_t h = hash_key(key);
  const uint8_t digest = digest_of(h);
  const ProbeOrder order(h, t.bucket_capacity);
  const int window = t.num_buckets < kMaxProbeBuckets ? static_cast<int>(t.num_buckets)
                                                      : kMaxProbeBuckets;
  int64_t b = bucket_of(h, t.num_buckets);
  for (int k = 0; k < window; ++k) {
    P::lock(t.lock_word(b));
    const int64_t slot = bucket_find<P>(t, b, key, digest, order);
    if (slot >= 0) t.set_digest(slot, kEmptyDigest);
    const bool chained = t.overflowed(b);
    P::unlock(t.lock_word(b));
    if (slot >= 0) return true;
    if (!chained) return false;
    b = t.next_bucket(b);
  }
  return false;
}

/// Claims `slot` of `dst` for the entry of slot `s` of `src` (a rehash moves each
/// key once, with its score, timestamp and pin; the caller copies the row).
template <class V>
DYNEMB_HD DYNEMB_INLINE void claim_moved(const TableRef<V>& dst, int64_t slot,
                                         const TableRef<V>& src, int64_t s, uint8_t digest) {
  claim(dst, slot, src.key(s), digest, src.has_scores() ? src.score(s) : 0,
        src.has_timestamps() ? src.timestamp(s) : 0, src.has_pins() ? src.pin(s) : 0);
}

/// Pass 1 of a rehash: places the entry of slot `s` of `src`, whose key is absent
/// from `t`, in its home bucket. @return the slot, or -1 (nothing changed) when the
/// home bucket is full: place_moved then places it in pass 2.
template <class P, class V>
DYNEMB_HD int64_t place_home(const TableRef<V>& t, const TableRef<V>& src, int64_t s) {
  const uint64_t h = hash_key(src.key(s));
  const ProbeOrder order(h, t.bucket_capacity);
  const int64_t b = bucket_of(h, t.num_buckets);
  P::lock(t.lock_word(b));
  const int64_t slot = bucket_free_slot<P>(t, b, order);
  if (slot >= 0) claim_moved(t, slot, src, s, digest_of(h));
  P::unlock(t.lock_word(b));
  return slot;
}

/// Places the entry of slot `s` of `src`, whose key is absent from `t` (a rehash
/// moves each key once), spilling over `window` buckets; one lock at a time is
/// enough because no other thread places the same key.
/// @return the slot, or -1 when the whole window is full.
template <class P, class V>
DYNEMB_HD int64_t place_moved(const TableRef<V>& t, const TableRef<V>& src, int64_t s,
                              int window) {
  const uint64_t h = hash_key(src.key(s));
  const ProbeOrder order(h, t.bucket_capacity);
  int64_t b = bucket_of(h, t.num_buckets);
  for (int k = 0; k < window; ++k) {
    P::lock(t.lock_word(b));
    const int64_t slot = bucket_free_slot<P>(t, b, order);
    if (slot >= 0) {
      claim_moved(t, slot, src, s, digest_of(h));
      P::unlock(t.lock_word(b));
      return slot;
    }
    t.set_overflowed(b);
    P::unlock(t.lock_word(b));
    b = t.next_bucket(b);
  }
  return -1;
}

}  // namespace dynemb
