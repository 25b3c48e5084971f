// dynemb core: de-duplicating a batch of keys (unique keys, inverse, counts).
//
// An open-addressing set of `capacity` cells (a power of two >= 2n), linear
// probing from hash_key(key). A cell holds a key and its dense id (uid); uid -1
// marks an empty cell and -2 a cell being claimed. A thread claims an empty cell
// with a compare-and-swap, writes the key, takes the next uid and publishes it;
// threads meeting a cell being claimed wait for the uid before comparing keys.
// Run sequentially (the CPU executor), uids follow first occurrence; on a GPU
// their order depends on scheduling but each distinct key still gets one uid.
#pragma once

#include "core/hash.h"

namespace dynemb {

struct DedupSetRef {
  int64_t* keys;       // (capacity)
  int32_t* uids;       // (capacity), -1 on entry
  int64_t capacity;    // power of two
  int32_t* next_uid;   // (1)
  int64_t* unique;     // (n) out: unique keys by uid
};

/// Platform additions used here: int32_t P::cas32(int32_t* p, int32_t expected, int32_t desired)
/// returning the previous value, int32_t P::load32(int32_t*), void P::store32(int32_t*, int32_t),
/// int32_t P::fetch_add32(int32_t*, int32_t).
/// @return the uid of key; *is_new tells whether this call created it.
template <class P>
DYNEMB_HD int32_t dedup_insert(const DedupSetRef& s, int64_t key, bool* is_new) {
  const int64_t mask = s.capacity - 1;
  int64_t cell = static_cast<int64_t>(hash_key(key) & static_cast<uint64_t>(mask));
  for (;;) {
    int32_t uid = P::load32(s.uids + cell);
    if (uid == -1 && P::cas32(s.uids + cell, -1, -2) == -1) {
      s.keys[cell] = key;
      uid = P::fetch_add32(s.next_uid, 1);
      s.unique[uid] = key;
      P::store32(s.uids + cell, uid);
      *is_new = true;
      return uid;
    }
    while ((uid = P::load32(s.uids + cell)) == -2) {
    }
    if (s.keys[cell] == key) {
      *is_new = false;
      return uid;
    }
    cell = (cell + 1) & mask;
  }
}

}  // namespace dynemb
