// dynemb core: the batch rule's passes (table_ops.h) run by a tile of lanes.
//
// table_ops.h's touch_or_place_free, place_by_victim, upsert_home and upsert_spill for
// a tile (bucket_tile.h) that serves a key with all of its lanes: the probe and the
// free-slot search (one scan of the digests: tile_bucket_probe) and the victim are the
// tile scans (the answers of bucket.h's scans), the decisions are
// table_ops.h's own (touch, claim, admits, the sink calls), so every executor keeps
// the same outcome, bit for bit.
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
// writes).
#pragma once

#include "core/batch_sinks.h"
#include "core/bucket_tile.h"
#include "core/table_ops.h"

namespace dynemb {

/// The elements of a row the calling lane of `tile` writes.
template <class Tile>
DYNEMB_HD DYNEMB_INLINE Lanes lanes_of(const Tile& tile) {
  return Lanes{tile.rank(), Tile::kSize};
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

/// place_new_home by a tile: `slot` is tile_free_slot's answer.
template <class Tile, class V, class Sink>
DYNEMB_HD DYNEMB_INLINE Status tile_place_new_home(const Tile& tile, const TableRef<V>& t,
                                                   int64_t i, int64_t o, int64_t key,
                                                   const KeyProbe& p, const UpsertArgs& u,
                                                   Sink& sink, int64_t slot) {
  const ScoreArgs& a = u.score;
  const uint64_t score = score_for_new(a, i);
  Status status = Status::kFailed;
  int64_t claimed = -1;
  if (slot >= 0) {
    status = Status::kInserted;
    claimed = slot;
  } else {
    const int64_t victim =
        tile_victim(tile, t, p.bucket, pin_mask(a.strategy), u.evict_below, u.pin_floor);
    if (victim >= 0 && admits(a.strategy, score, t.score(victim))) {
      status = Status::kEvicted;
      claimed = victim;
    }
  }
  const Lanes l = lanes_of(tile);
  if (status == Status::kEvicted) {
    sink.evicting(i, claimed, l);
    tile.sync();  // the victim's row and key are read before they are overwritten
  }
  if (claimed >= 0) {
    tile_claim(tile, t, claimed, key, p.digest, score, a.batch_value, u.pin);
    sink.fresh(i, o, claimed, key, l);
  } else {
    sink.failed(i, o, key, l);
  }
  return status;
}

/// upsert_home by a tile that owns bucket p.bucket (same contract and kChosen: decides
/// key i when that bucket alone can and returns true, with *status set in every lane;
/// returns false, having changed nothing, for a key that needs its second bucket).
template <bool kChosen = false, class Tile, class V, class Sink>
DYNEMB_HD bool tile_upsert_home(const Tile& tile, const TableRef<V>& t, int64_t i, int64_t o,
                                int64_t key, const KeyProbe& p, const UpsertArgs& u,
                                Sink& sink, Status* status) {
  const int64_t home = p.bucket;
  if (!kChosen && t.overflowed(home)) return false;
  bool decided = false;
  const TileProbe q = tile_bucket_probe(tile, t, home, key, p.digest, p.order);  // one scan
  if (q.slot >= 0) {
    if (tile.rank() == 0) touch(t, q.slot, u, i);
    sink.hit(i, o, q.slot, lanes_of(tile));
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

/// hit_stored by a tile that owns the slot's bucket: the hit of a key pass 0 found
/// stored in `slot`, without probing again. @return kHit, in every lane.
template <class Tile, class V, class Sink>
DYNEMB_HD Status tile_hit_stored(const Tile& tile, const TableRef<V>& t, int64_t i, int64_t o,
                                 int64_t slot, const UpsertArgs& u, Sink& sink) {
  if (tile.rank() == 0) touch(t, slot, u, i);
  sink.hit(i, o, slot, lanes_of(tile));
  tile.sync();
  return Status::kHit;
}

/// place_new_chosen by a tile that owns bucket p.bucket: a key of a distinct batch that
/// pass 0 found stored in neither of its buckets takes the bucket's first free slot
/// (one digest scan, no key read), else returns false, having changed nothing.
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

/// choose_bucket by a tile (pass 0: reads only), `stored` as there. @return the same
/// in every lane.
template <class Tile, class V>
DYNEMB_HD int64_t tile_choose_bucket(const Tile& tile, const TableRef<V>& t, int64_t key,
                                     int64_t* stored = nullptr) {
  const uint64_t h = hash_key(key);
  const KeyProbe p = KeyProbe::of_hash(t, h);
  const int64_t home = p.bucket;
  int64_t slot = tile_bucket_find(tile, t, home, key, p.digest, p.order.home);
  const int64_t second = second_bucket_of(h, t.num_buckets);
  if (slot < 0 && t.overflowed(home)) {
    slot = tile_bucket_find(tile, t, second, key, p.digest, p.order.home);
  }
  if (stored != nullptr) *stored = slot;
  if (slot >= 0) return slot / t.bucket_capacity;
  const int64_t home_free = tile_free_count(tile, t, home);
  if (home_takes_new_keys(t, home_free)) return home;
  return tile_free_count(tile, t, second) > home_free ? second : home;
}

/// touch_or_place_free by a tile that owns `key`'s home bucket (hits_first's pass, in
/// one probe: tile_bucket_probe yields the key's slot or the bucket's first free slot):
/// a stored key is touched and reported, *status kHit; a key not stored whose home
/// bucket (not overflowed) has a free slot takes it, *status kInserted. @return false,
/// having changed nothing, for a key that needs a victim (or its window): the pass
/// after decides it (tile_upsert_owned; tile_place_by_victim in a distinct batch).
template <class Tile, class V, class Sink>
DYNEMB_HD bool tile_touch_or_place_free(const Tile& tile, const TableRef<V>& t, int64_t i,
                                        int64_t o, int64_t key, const KeyProbe& p,
                                        const UpsertArgs& u, Sink& sink, Status* status) {
  const TileProbe q = tile_bucket_probe(tile, t, p.bucket, key, p.digest, p.order);
  bool decided = false;
  if (q.slot >= 0) {
    if (tile.rank() == 0) touch(t, q.slot, u, i);
    sink.hit(i, o, q.slot, lanes_of(tile));
    *status = Status::kHit;
    decided = true;
  } else if (q.free >= 0 && !t.overflowed(p.bucket)) {
    *status = tile_place_new_home(tile, t, i, o, key, p, u, sink, q.free);
    decided = true;
  }
  tile.sync();
  return decided;
}

/// place_by_victim by a tile that owns the key's home bucket: a key of a distinct batch
/// that tile_touch_or_place_free left (not stored, no free home slot) takes the bucket's
/// victim or fails, without probing the bucket again. @return the status, in every lane.
template <class Tile, class V, class Sink>
DYNEMB_HD Status tile_place_by_victim(const Tile& tile, const TableRef<V>& t, int64_t i,
                                      int64_t o, int64_t key, const KeyProbe& p,
                                      const UpsertArgs& u, Sink& sink) {
  const Status s = tile_place_new_home(tile, t, i, o, key, p, u, sink, -1);
  tile.sync();
  return s;
}

/// upsert_spill by the one tile of pass 2 (it owns the table): the same decisions,
/// each bucket scanned by the tile, one lane writing the metadata (touch, claim,
/// overflow flag). @return the status, in every lane.
template <class Tile, class V, class Sink>
DYNEMB_HD Status tile_upsert_spill(const Tile& tile, const TableRef<V>& t, int64_t i, int64_t o,
                                   int64_t key, const UpsertArgs& u, Sink& sink) {
  const uint64_t h = hash_key(key);
  const KeyProbe p = KeyProbe::of_hash(t, h);
  const ScoreArgs& a = u.score;
  const int64_t second = window_of(t, a.strategy) > 1 ? second_bucket_of(h, t.num_buckets) : -1;
  const Lanes l = lanes_of(tile);
  int64_t found = tile_bucket_find(tile, t, p.bucket, key, p.digest, p.order.home);
  if (found < 0 && second >= 0 && t.overflowed(p.bucket)) {
    found = tile_bucket_find(tile, t, second, key, p.digest, p.order.home);
  }
  Status status = Status::kFailed;
  if (found >= 0) {
    if (tile.rank() == 0) touch(t, found, u, i);
    sink.hit(i, o, found, l);
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
      sink.fresh(i, o, slot, key, l);
      status = Status::kInserted;
    } else {
      sink.failed(i, o, key, l);
    }
  }
  tile.sync();  // the next key's scans see this key's writes
  return status;
}

/// Pass 1 of a batch upsert for a key not touched as stored: tile_upsert_home, and, where
/// the spill window is one bucket (window_of: every evicting strategy; NO_EVICTION on a
/// table of one bucket), tile_upsert_spill in place for a key it leaves. That window is
/// the home bucket, which the tile owns, so pass 2 would read and write nothing else; and
/// pass 1 writes nothing there that upsert_spill reads before it (once a key is left,
/// the bucket's other keys are hits, touched, or left as well, and come here in batch
/// order). The outcome is pass 2's, and pass 2 has nothing to do.
/// @return false (nothing changed) only for a key whose window has more buckets; else
/// true, with *status set in every lane.
template <bool kChosen = false, class Tile, class V, class Sink>
DYNEMB_HD bool tile_upsert_owned(const Tile& tile, const TableRef<V>& t, int64_t i, int64_t o,
                                 int64_t key, const KeyProbe& p, const UpsertArgs& u,
                                 Sink& sink, Status* status) {
  if (tile_upsert_home<kChosen>(tile, t, i, o, key, p, u, sink, status)) return true;
  if (window_of(t, u.score.strategy) != 1) return false;
  *status = tile_upsert_spill(tile, t, i, o, key, u, sink);
  return true;
}

}  // namespace dynemb
