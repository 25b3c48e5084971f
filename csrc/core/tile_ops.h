// dynemb core: the batch rule's per-key ops (table_ops.h "Batch rule"), written once for
// a tile of lanes (bucket_tile.h) that serves a key with all of its lanes: a CUDA warp
// tile, or the one lane of the CPU's SerialTile.
//
// The probe and the free-slot search (one scan of the digests: tile_bucket_probe) and
// the victim are the tile scans; the decisions are table_ops.h's (touch, claim, admits)
// and the sink calls (tile_sink_*), so every executor keeps the same outcome, bit for bit.
//
// Ownership, not locks. These run only in a pass that owns its buckets: pass 1 of a
// batch upsert, where one tile serves every key of a home-bucket range in batch order
// (a bucket's keys are all in one range), and pass 2, where one tile serves every
// deferred key of the batch in batch order (it owns the whole table), so no other
// lane reads or writes the bucket meanwhile. Hence no bucket lock and no fence; the
// tile's own order is kept by tile.sync() (votes and shuffles order no memory): one
// lane writes each field (touch and overflow flags lane 0; a claim's key and digest the
// slot's digest_lane, the one lane whose scan read them, its score, timestamp and pin
// lane 0, the sinks' lead lane, which may overwrite them next: tile_claim),
// every lane calls the sink with its Lanes (batch_sinks.h: its elements of the rows),
// and the tile syncs after an eviction's capture (every lane read the victim's score,
// key and row before they are overwritten), before pass 2 sets an overflow flag (every
// lane read the flags) and after each key (the next key's scans and rows must see its
// writes). A SerialTile's syncs, votes and shuffles are no-ops.
#pragma once

#include "core/batch_sinks.h"
#include "core/bucket_tile.h"
#include "core/table_ops.h"
#include "core/tile_room.h"

namespace dynemb {

/// Whether pass 2 may move a resident to its other bucket to make room for a key whose
/// two buckets are full (tile_room.h): for a sink that reports no slot (a slot reported
/// earlier in the batch would go stale), a restore's (RestoreSink::kMovesResidents). The
/// table's owner counts every upsert as a mutation, so a training batch in flight finds
/// its keys again before its backward (dynemb/table/table_state.py "mutations").
template <class Sink>
DYNEMB_HD constexpr bool moves_residents() {
  if constexpr (requires { Sink::kMovesResidents; }) {
    return Sink::kMovesResidents;
  } else {
    return false;
  }
}

/// The elements of a row the calling lane of `tile` writes.
template <class Tile>
DYNEMB_HD DYNEMB_INLINE Lanes lanes_of(const Tile& tile) {
  return Lanes{tile.rank(), Tile::kSize};
}

/// The sink calls of a tile (batch_sinks.h): a one-lane tile (the CPU's) calls the
/// whole-row forms, whose Store may stream rows (the CPU's StreamingStore); a wider
/// tile the Lanes forms, each lane its elements of the rows.
template <class Tile, class Sink>
DYNEMB_HD DYNEMB_INLINE void tile_sink_hit(const Tile& tile, Sink& sink, int64_t i, int64_t o,
                                           int64_t slot) {
  if constexpr (Tile::kSize == 1) {
    sink.hit(i, o, slot);
  } else {
    sink.hit(i, o, slot, lanes_of(tile));
  }
}
template <class Tile, class Sink>
DYNEMB_HD DYNEMB_INLINE void tile_sink_evicting(const Tile& tile, Sink& sink, int64_t i,
                                                int64_t slot) {
  if constexpr (Tile::kSize == 1) {
    sink.evicting(i, slot);
  } else {
    sink.evicting(i, slot, lanes_of(tile));
  }
}
template <class Tile, class Sink>
DYNEMB_HD DYNEMB_INLINE void tile_sink_fresh(const Tile& tile, Sink& sink, int64_t i, int64_t o,
                                             int64_t slot, int64_t key) {
  if constexpr (Tile::kSize == 1) {
    sink.fresh(i, o, slot, key);
  } else {
    sink.fresh(i, o, slot, key, lanes_of(tile));
  }
}
template <class Tile, class Sink>
DYNEMB_HD DYNEMB_INLINE void tile_sink_failed(const Tile& tile, Sink& sink, int64_t i,
                                              int64_t o, int64_t key) {
  if constexpr (Tile::kSize == 1) {
    sink.failed(i, o, key);
  } else {
    sink.failed(i, o, key, lanes_of(tile));
  }
}

/// Whether `hint` (a slot, or -1), a guess at where `key` (of KeyProbe `p`) is stored,
/// holds it: a key occupies one slot at most, so the guess is then the answer.
template <class V>
DYNEMB_HD DYNEMB_INLINE bool hint_holds(const TableRef<V>& t, int64_t hint, int64_t key,
                                        const KeyProbe& p) {
  return hint >= 0 && t.digest(hint) == p.digest && t.key(hint) == key;
}

/// tile_bucket_probe of bucket p.bucket for `key`, with a guess: `hint`, a slot that
/// likely holds the key (the CPU's likely_slot, computed to prefetch), or -1. When the
/// hint holds the key it is the answer (a key has one slot at most) and the scan is
/// saved; it decides nothing.
template <class Tile, class V>
DYNEMB_HD DYNEMB_INLINE TileProbe tile_probe_hinted(const Tile& tile, const TableRef<V>& t,
                                                    int64_t key, const KeyProbe& p,
                                                    int64_t hint) {
  if (hint_holds(t, hint, key, p)) return {hint, -1};
  return tile_bucket_probe(tile, t, p.bucket, key, p.digest, p.order);
}

/// claim by a tile, without a sync: the slot's digest_lane writes its key and digest
/// (the one lane whose scan read them), lane 0 its score, timestamp and pin (the lane
/// that writes them next: the sinks' lead lane, e.g. RestoreSink's saved score).
template <class Tile, class V>
DYNEMB_HD DYNEMB_INLINE void tile_claim(const Tile& tile, const TableRef<V>& t, int64_t slot,
                                        int64_t key, uint8_t digest, uint64_t score,
                                        uint64_t timestamp, uint32_t pin) {
  if (tile.rank() == digest_lane(tile, t, slot)) claim_identity(t, slot, key, digest);
  if (tile.rank() == 0) claim_metadata(t, slot, score, timestamp, pin);
}

/// Places key i, known not to be stored, in bucket p.bucket: at `slot`, a free slot
/// (tile_free_slot's answer), when >= 0; else at `victim`, the full bucket's victim
/// (tile_victim's, or the CPU's BucketVictims'; -1: none), when the strategy admits the
/// key there (sink.evicting, then the claim); else it fails. Calls sink.fresh or
/// sink.failed. @return the status, the same in every lane.
template <class Tile, class V, class Sink>
DYNEMB_HD DYNEMB_INLINE Status tile_place_at(const Tile& tile, const TableRef<V>& t, int64_t i,
                                             int64_t o, int64_t key, const KeyProbe& p,
                                             const UpsertArgs& u, Sink& sink, int64_t slot,
                                             int64_t victim) {
  const ScoreArgs& a = u.score;
  const uint64_t score = score_for_new(a, i);
  Status status = Status::kFailed;
  int64_t claimed = -1;
  if (slot >= 0) {
    status = Status::kInserted;
    claimed = slot;
  } else if (victim >= 0 && admits(a.strategy, score, t.score(victim))) {
    status = Status::kEvicted;
    claimed = victim;
  }
  if (status == Status::kEvicted) {
    tile_sink_evicting(tile, sink, i, claimed);
    tile.sync();  // the victim's row and key are read before they are overwritten
  }
  if (claimed >= 0) {
    tile_claim(tile, t, claimed, key, p.digest, score, a.batch_value, u.pin);
    tile_sink_fresh(tile, sink, i, o, claimed, key);
  } else {
    tile_sink_failed(tile, sink, i, o, key);
  }
  return status;
}

/// tile_place_at in bucket p.bucket: `slot` (tile_free_slot's answer), else (slot -1,
/// evicting strategies) the bucket's tile_victim: not pinned, below the eviction floor.
template <class Tile, class V, class Sink>
DYNEMB_HD DYNEMB_INLINE Status tile_place_new_home(const Tile& tile, const TableRef<V>& t,
                                                   int64_t i, int64_t o, int64_t key,
                                                   const KeyProbe& p, const UpsertArgs& u,
                                                   Sink& sink, int64_t slot) {
  const int64_t victim =
      slot >= 0 ? -1
                : tile_victim(tile, t, p.bucket, pin_mask(u.score.strategy), u.evict_below,
                              u.pin_floor);
  return tile_place_at(tile, t, i, o, key, p, u, sink, slot, victim);
}

/// Pass 1 of a batch upsert under NO_EVICTION, by a tile that owns bucket p.bucket (see
/// "Batch rule" in table_ops.h): decides key i when that bucket alone can (a hit there,
/// or a free slot there), calling exactly one of sink.hit / sink.fresh / sink.failed,
/// and returns true with *status set in every lane. Returns false, having changed
/// nothing, for a key that needs its second bucket: tile_upsert_spill decides it in
/// pass 2. Under an evicting strategy executors run it after the pass that touches the
/// stored keys (hits_first).
/// kChosen: p.bucket is tile_choose_bucket's answer (pass 0 ran), which already looked
/// for the key in both buckets; else p.bucket is the key's home, and a flagged home (the
/// key may be in its second bucket) leaves the key to pass 2.
/// `p`: KeyProbe(t, key), computed by the caller (its bucket maybe replaced); `hint`:
/// as tile_probe_hinted.
template <bool kChosen = false, class Tile, class V, class Sink>
DYNEMB_HD bool tile_upsert_home(const Tile& tile, const TableRef<V>& t, int64_t i, int64_t o,
                                int64_t key, const KeyProbe& p, const UpsertArgs& u,
                                Sink& sink, Status* status, int64_t hint = -1) {
  const int64_t home = p.bucket;
  if (!kChosen && t.overflowed(home)) return false;
  bool decided = false;
  const TileProbe q = tile_probe_hinted(tile, t, key, p, hint);  // one scan
  if (q.slot >= 0) {
    if (tile.rank() == 0) touch(t, q.slot, u, i);
    tile_sink_hit(tile, sink, i, o, q.slot);
    *status = Status::kHit;
    decided = true;
  } else if (q.free >= 0 || evicts(u.score.strategy)) {
    *status = tile_place_new_home(tile, t, i, o, key, p, u, sink, q.free);
    if (q.free >= 0 && !evicts(u.score.strategy) && tile.rank() == 0) {
      flag_if_second(t, key, home);
    }
    decided = true;
  }
  tile.sync();
  return decided;
}

/// Pass 1 of a key that pass 0 found stored in `slot` (tile_choose_bucket's `stored`),
/// by a tile that owns the slot's bucket: the hit tile_upsert_home<true> would make in
/// its chosen bucket, without the probe that would find the same slot again (pass 1
/// moves and evicts no stored key under NO_EVICTION). @return kHit, in every lane.
template <class Tile, class V, class Sink>
DYNEMB_HD DYNEMB_INLINE Status tile_hit_stored(const Tile& tile, const TableRef<V>& t, int64_t i,
                                                int64_t o, int64_t slot, const UpsertArgs& u,
                                                Sink& sink) {
  if (tile.rank() == 0) touch(t, slot, u, i);
  tile_sink_hit(tile, sink, i, o, slot);
  tile.sync();
  return Status::kHit;
}

/// Pass 1 of a key of a distinct batch (UpsertArgs::distinct) that pass 0 found stored
/// in neither of its buckets, by a tile that owns bucket p.bucket: tile_upsert_home<true>'s
/// outcome without its find, which would find nothing (no other key of the batch is this
/// key, and pass 1 moves no stored key): the chosen bucket's first free slot (one digest
/// scan, no key read; the key's home is flagged when it is its second bucket), else
/// false, having changed nothing (pass 2 decides). NO_EVICTION only (it runs pass 0).
/// @return the same in every lane, with *status set in every lane when true.
template <class Tile, class V, class Sink>
DYNEMB_HD bool tile_place_new_chosen(const Tile& tile, const TableRef<V>& t, int64_t i,
                                     int64_t o, int64_t key, const KeyProbe& p,
                                     const UpsertArgs& u, Sink& sink, Status* status) {
  const int64_t free = tile_free_slot(tile, t, p.bucket, p.order);  // every lane agrees
  if (free >= 0) {
    *status = tile_place_new_home(tile, t, i, o, key, p, u, sink, free);
    if (tile.rank() == 0) flag_if_second(t, key, p.bucket);
  }
  tile.sync();
  return free >= 0;
}

/// Pass 0 of a batch upsert under NO_EVICTION (chooses_buckets; see "Batch rule" in
/// table_ops.h), by a tile; reads only: the bucket whose owner decides `key` in pass 1:
/// the one that stores it, else its home while home_takes_new_keys, else the emptier of
/// its home and second bucket (ties: home). `p`: KeyProbe(t, key). `stored` (when not
/// null) receives the slot that stores the key, else -1 (its pass 1 is then
/// tile_hit_stored). `hint`: as tile_probe_hinted. @return the same in every lane.
/// Keeping a new key home unless its second bucket had a margin more free slots made
/// finds cheaper but the first failed insert earlier (buckets of 128: margins 0, 1, 2, 8
/// gave 3.4, 2.9, 2.7, 2.35 metadata lines a find at load 0.75, and loads 0.959, 0.951,
/// 0.942, ~0.92 at 16M slots).
template <class Tile, class V>
DYNEMB_HD int64_t tile_choose_bucket(const Tile& tile, const TableRef<V>& t, int64_t key,
                                     const KeyProbe& p, int64_t* stored = nullptr,
                                     int64_t hint = -1) {
  const int64_t home = p.bucket;
  int64_t slot = hint_holds(t, hint, key, p) ? hint : -1;
  if (slot < 0) slot = tile_bucket_find(tile, t, home, key, p.digest, p.order.home);
  const int64_t second = second_bucket_of(hash_key(key), t.num_buckets);
  if (slot < 0 && t.overflowed(home)) {
    slot = tile_bucket_find(tile, t, second, key, p.digest, p.order.home);
  }
  if (stored != nullptr) *stored = slot;
  if (slot >= 0) return slot / t.bucket_capacity;
  const int64_t home_free = tile_free_count(tile, t, home);
  if (home_takes_new_keys(t, home_free)) return home;
  return tile_free_count(tile, t, second) > home_free ? second : home;
}

/// Pass 1 of a hits-first batch (hits_first), by a tile that owns `key`'s home bucket, in
/// one probe where one is enough (tile_bucket_probe yields the key's slot or the
/// bucket's first free slot): a stored key is touched (its score, and its pin: see
/// "Pins" in table_ops.h) and reported, *status kHit; a key not stored whose home bucket
/// (not overflowed) has a free slot takes it, *status kInserted. That is what
/// tile_upsert_home gives it after every touch of the pass: touches write no digest, so
/// the free slots, and the order the bucket's new keys take them in, are the same. Only
/// a key whose home bucket is full (or has overflowed) needs the bucket's hits pinned
/// before it looks for a victim: returns false for it, having changed nothing, and the
/// pass after decides it (tile_upsert_owned; tile_place_by_victim in a distinct batch).
/// Evicting strategies only (hits_first). `hint`: as tile_probe_hinted.
template <class Tile, class V, class Sink>
DYNEMB_HD bool tile_touch_or_place_free(const Tile& tile, const TableRef<V>& t, int64_t i,
                                        int64_t o, int64_t key, const KeyProbe& p,
                                        const UpsertArgs& u, Sink& sink, Status* status,
                                        int64_t hint = -1) {
  const TileProbe q = tile_probe_hinted(tile, t, key, p, hint);
  bool decided = false;
  if (q.slot >= 0) {
    if (tile.rank() == 0) touch(t, q.slot, u, i);
    tile_sink_hit(tile, sink, i, o, q.slot);
    *status = Status::kHit;
    decided = true;
  } else if (q.free >= 0 && !t.overflowed(p.bucket)) {
    *status = tile_place_new_home(tile, t, i, o, key, p, u, sink, q.free);
    decided = true;
  }
  tile.sync();
  return decided;
}

/// tile_upsert_home of a key of a distinct batch (UpsertArgs::distinct) that
/// tile_touch_or_place_free left, in one step, by a tile that owns its home bucket: the
/// key is not stored (pass 1 found it absent, and no other key of the batch is it) and
/// its home bucket has no free slot (pass 1 found none, and an upsert frees none), so
/// the probe would only confirm that; the outcome is tile_upsert_home's: the bucket's
/// victim or failed. @return the status, in every lane.
template <class Tile, class V, class Sink>
DYNEMB_HD Status tile_place_by_victim(const Tile& tile, const TableRef<V>& t, int64_t i,
                                      int64_t o, int64_t key, const KeyProbe& p,
                                      const UpsertArgs& u, Sink& sink) {
  const Status s = tile_place_new_home(tile, t, i, o, key, p, u, sink, -1);
  tile.sync();
  return s;
}

/// Moves the entry of m.from, with its row, to m.to (tile_room.h move_for_room), by the
/// tile that owns the table; m.from is left empty for the caller to claim at once.
template <class Tile, class V>
DYNEMB_HD DYNEMB_INLINE void tile_move_for_room(const Tile& tile, const TableRef<V>& t,
                                                const RoomMove& m) {
  copy_row(t.row(m.from), t.row(m.to), t.row_width, lanes_of(tile));
  tile.sync();  // every lane read the digests and keys, and moved its part of the row
  if (tile.rank() == 0) move_for_room(t, m);
  tile.sync();  // the row at m.from is overwritten next
}

/// For tile_upsert_spill, by the tile that owns the table, when both buckets of `key`
/// (home p.bucket, and `second`, or -1) are full: claims a slot of the home or then the
/// second bucket freed by moving one of its residents, with its row, to the resident's
/// other bucket (tile_room_in), else by a chain of two such moves, else of three
/// (tile_room_chain), each when some bucket within its reach has a free slot
/// (tile_room_within_reach); the home is flagged for a key placed in its second
/// bucket. A NO_EVICTION table of 2^20 slots
/// saved at its max capacity (a load of 0.969) and restored in one call lost 7,400 keys
/// in slot order and 9,109 in a random order without moves, 0 and 2 with chains of one
/// or two, 0 and 0 with chains of three too (benchmark/RESULTS.md).
/// @return the slot, or -1 when no room was found, in every lane; the caller's sink
/// writes the row after.
template <class Tile, class V>
DYNEMB_HD int64_t tile_claim_by_move(const Tile& tile, const TableRef<V>& t, int64_t key,
                                     const KeyProbe& p, const UpsertArgs& u, uint64_t score,
                                     int64_t second) {
  int64_t slot = -1;
  // Each search only where a bucket within its reach has a free slot.
  const bool three = second >= 0 && tile_room_within_reach<3>(tile, t, p.bucket, second);
  const bool two = three && tile_room_within_reach<2>(tile, t, p.bucket, second);
  for (int k = 0; k < 2 && two && slot < 0; ++k) {
    const RoomMove m = tile_room_in(tile, t, k == 0 ? p.bucket : second);
    if (m.from < 0) continue;
    tile_move_for_room(tile, t, m);
    slot = m.from;
  }
  for (int k = 0; k < 2 && two && slot < 0; ++k) {
    const RoomChain c = tile_room_chain<2>(tile, t, k == 0 ? p.bucket : second);
    if (c.from < 0) continue;
    tile_move_for_room(tile, t, c.inner);
    tile_move_for_room(tile, t, RoomMove{c.from, c.inner.from});
    slot = c.from;
  }
  for (int k = 0; k < 2 && three && slot < 0; ++k) {
    const RoomChain3 c = tile_room_chain<3>(tile, t, k == 0 ? p.bucket : second);
    if (c.from < 0) continue;
    tile_move_for_room(tile, t, c.inner.inner);
    tile_move_for_room(tile, t, RoomMove{c.inner.from, c.inner.inner.from});
    tile_move_for_room(tile, t, RoomMove{c.from, c.inner.from});
    slot = c.from;
  }
  if (slot >= 0 && tile.rank() == 0) {
    claim(t, slot, key, p.digest, score, u.score.batch_value, u.pin);
    if (slot / t.bucket_capacity != p.bucket) t.set_overflowed(p.bucket);
  }
  tile.sync();  // the sink's lanes write the row after the claim
  return slot;
}

/// Pass 2 of a batch upsert, by the one tile of pass 2 (it owns the table): key i, left
/// by tile_upsert_home: a hit in its home bucket or (a flagged home) its second, else the
/// first of the two with a free slot (a key placed in its second bucket flags its home),
/// else, for a sink that moves residents (moves_residents: a restore), a slot of its home
/// or then its second bucket freed by moving residents to their other bucket
/// (tile_claim_by_move), else failed. Calls exactly one sink function; one lane writes the
/// metadata (touch, claim, move, overflow flag). kMoves false compiles the moves out for a
/// caller whose window is one bucket (tile_upsert_owned), where none can happen.
/// @return the status, in every lane.
template <bool kMoves = true, class Tile, class V, class Sink>
DYNEMB_HD Status tile_upsert_spill(const Tile& tile, const TableRef<V>& t, int64_t i, int64_t o,
                                   int64_t key, const UpsertArgs& u, Sink& sink) {
  const uint64_t h = hash_key(key);
  const KeyProbe p = KeyProbe::of_hash(t, h);
  const ScoreArgs& a = u.score;
  const int64_t second = window_of(t, a.strategy) > 1 ? second_bucket_of(h, t.num_buckets) : -1;
  int64_t found = tile_bucket_find(tile, t, p.bucket, key, p.digest, p.order.home);
  if (found < 0 && second >= 0 && t.overflowed(p.bucket)) {
    found = tile_bucket_find(tile, t, second, key, p.digest, p.order.home);
  }
  Status status = Status::kFailed;
  if (found >= 0) {
    if (tile.rank() == 0) touch(t, found, u, i);
    tile_sink_hit(tile, sink, i, o, found);
    status = Status::kHit;
  } else {
    tile.sync();  // every lane read the overflow flag that lane 0 sets below
    int64_t slot = tile_free_slot(tile, t, p.bucket, p.order);  // every lane agrees
    if (slot < 0 && second >= 0) {
      slot = tile_free_slot(tile, t, second, p.order);
      if (slot >= 0 && tile.rank() == 0) t.set_overflowed(p.bucket);
    }
    if (slot >= 0) {
      tile_claim(tile, t, slot, key, p.digest, score_for_new(a, i), a.batch_value, u.pin);
    } else if constexpr (kMoves && moves_residents<Sink>()) {
      slot = tile_claim_by_move(tile, t, key, p, u, score_for_new(a, i), second);
    }
    if (slot >= 0) {
      tile_sink_fresh(tile, sink, i, o, slot, key);
      status = Status::kInserted;
    } else {
      tile_sink_failed(tile, sink, i, o, key);
    }
  }
  tile.sync();  // the next key's scans see this key's writes
  return status;
}

/// Pass 1 of a batch upsert for a key not touched as stored: tile_upsert_home, and, where
/// the spill window is one bucket (window_of: every evicting strategy; NO_EVICTION on a
/// table of one bucket), tile_upsert_spill in place for a key it leaves. That window is
/// the home bucket, which the tile owns, so pass 2 would read and write nothing else; and
/// pass 1 writes nothing there that tile_upsert_spill reads before it (once a key is
/// left, the bucket's other keys are hits, touched, or left as well, and come here in
/// batch order). The outcome is pass 2's, and pass 2 has nothing to do.
/// @return false (nothing changed) only for a key whose window has more buckets; else
/// true, with *status set in every lane.
template <bool kChosen = false, class Tile, class V, class Sink>
DYNEMB_HD bool tile_upsert_owned(const Tile& tile, const TableRef<V>& t, int64_t i, int64_t o,
                                 int64_t key, const KeyProbe& p, const UpsertArgs& u,
                                 Sink& sink, Status* status) {
  if (tile_upsert_home<kChosen>(tile, t, i, o, key, p, u, sink, status)) return true;
  if (window_of(t, u.score.strategy) != 1) return false;
  *status = tile_upsert_spill<false>(tile, t, i, o, key, u, sink);  // second bucket: -1
  return true;
}

}  // namespace dynemb
