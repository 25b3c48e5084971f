// dynemb core: de-duplicating a batch of keys (unique keys, inverse, counts).
//
// The rule, on every executor: distinct keys get dense ids (uids) in the order of
// their first occurrence in the batch; inverse[i] is the uid of keys[i]; counts[u]
// the occurrences of unique[u]. So the result is a function of the batch alone.
//
// The set: open addressing over `capacity` cells (dedup_capacity: a power of two
// >= 2n), linear probing from hash_key(key). A cell's state is kEmptyCell, then
// kClaimingCell while the thread that won it (a compare-and-swap) writes the key,
// then kReadyCell; threads meeting a cell being claimed wait for it before
// comparing keys. A sequential executor numbers cells as their keys first appear;
// a parallel one records each cell's smallest batch index (an atomic minimum) and
// numbers the cells whose key first appears at index i by a prefix sum over i.
//
// A sequential executor needs neither states nor atomics: DedupIdSetRef's cell holds
// uid + 1 (0: empty), and the key is compared through unique[uid]. One 4-byte word
// per cell instead of 20 bytes in three arrays: a batch of 65,536 keys uses 512 KB
// (the core's L2) instead of 2.5 MB, and a probe reads one line of it. The cells a
// key meets differ from DedupSetRef's, the uids (its first occurrence) do not.
#pragma once

#include "core/hash.h"

namespace dynemb {

constexpr int32_t kEmptyCell = -1;
constexpr int32_t kClaimingCell = -2;
constexpr int32_t kReadyCell = 0;

/// Cells of the set for a batch of n keys: a power of two >= 2n, at least 16.
DYNEMB_HD DYNEMB_INLINE int64_t dedup_capacity(int64_t n) {
  int64_t capacity = 16;
  while (capacity < 2 * n) capacity <<= 1;
  return capacity;
}

struct DedupSetRef {
  int64_t* keys;     // (capacity)
  int32_t* states;   // (capacity), kEmptyCell on entry
  int64_t capacity;  // dedup_capacity(n)
};

/// Platform additions used here: int32_t P::cas32(int32_t* p, int32_t expected, int32_t desired)
/// returning the previous value, int32_t P::load32(int32_t*), void P::store32(int32_t*, int32_t).
/// @return the cell of key; *is_new tells whether this call claimed it.
template <class P>
DYNEMB_HD int64_t dedup_cell(const DedupSetRef& s, int64_t key, bool* is_new) {
  const int64_t mask = s.capacity - 1;
  int64_t cell = static_cast<int64_t>(hash_key(key) & static_cast<uint64_t>(mask));
  for (;;) {
    int32_t state = P::load32(s.states + cell);
    if (state == kEmptyCell && P::cas32(s.states + cell, kEmptyCell, kClaimingCell) == kEmptyCell) {
      s.keys[cell] = key;
      P::store32(s.states + cell, kReadyCell);
      *is_new = true;
      return cell;
    }
    while ((state = P::load32(s.states + cell)) == kClaimingCell) {
    }
    if (s.keys[cell] == key) {
      *is_new = false;
      return cell;
    }
    cell = (cell + 1) & mask;
  }
}

/// The sequential set: Id is uint32_t for batches of fewer than 2^32 - 1 keys.
template <class Id>
struct DedupIdSetRef {
  Id* ids;           // (capacity) uid + 1 of the key in each cell, 0 when empty
  int64_t capacity;  // dedup_capacity(n)
};

/// The first cell of key in a set of `capacity` cells (a power of two).
DYNEMB_HD DYNEMB_INLINE int64_t dedup_home_cell(int64_t key, int64_t capacity) {
  return static_cast<int64_t>(hash_key(key) & static_cast<uint64_t>(capacity - 1));
}

/// Sequential dedup of one key, starting at `cell` (dedup_home_cell): @return the uid of
/// key; a key not seen before gets uid *num_unique, stored in unique[*num_unique], and
/// *num_unique grows by one. One thread at a time per set.
template <class Id>
DYNEMB_HD DYNEMB_INLINE int64_t dedup_uid(const DedupIdSetRef<Id>& s, int64_t cell, int64_t key,
                                          int64_t* unique, int64_t* num_unique) {
  const int64_t mask = s.capacity - 1;
  for (;;) {
    const Id id = s.ids[cell];
    if (id == 0) {
      const int64_t u = (*num_unique)++;
      s.ids[cell] = static_cast<Id>(u + 1);
      unique[u] = key;
      return u;
    }
    if (unique[id - 1] == key) return static_cast<int64_t>(id - 1);
    cell = (cell + 1) & mask;
  }
}

}  // namespace dynemb
