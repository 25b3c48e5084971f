// dynemb CPU executor: erase, rehash and the cache exchange, the ops that remove
// entries or move them between tables (see executor_cpu.h).
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <omp.h>

#include <algorithm>
#include <vector>

#include "core/tile_erase.h"
#include "core/tile_rehash.h"
#include "cpu/batch_threads.h"
#include "cpu/cpu_platform.h"
#include "cpu/executor_cpu.h"
#include "cpu/prefetched_loop.h"

namespace dynemb::cpu {

using P = CpuPlatform;

namespace {

/// Pass 2 of an erase (core/tile_erase.h tile_erase_key, by the one lane of a
/// SerialTile): the keys pass 1 deferred, at positions `deferred` in batch order, on
/// one thread after every pass 1 ended; erased[j] is the outcome.
template <class V>
void erase_deferred(const TableRef<V>& t, const int64_t* keys,
                    const std::vector<int64_t>& deferred, bool* erased) {
  for (const int64_t j : deferred) erased[j] = tile_erase_key(SerialTile{}, t, keys[j]);
}

/// Erases keys[j] for j in [0, n) by the two passes of core/tile_erase.h, on one
/// thread; erased[j] is the outcome.
template <class V>
void erase_sequence(const TableRef<V>& t, const int64_t* keys, int64_t n, bool* erased) {
  std::vector<int64_t> deferred;
  auto key_at = [&](int64_t j) { return keys[j]; };
  // Prefetches the digests and the likely key; no score nor row (erase reads neither).
  auto body = [&](int64_t j, int64_t) {
    const EraseHome e = tile_erase_home(SerialTile{}, t, key_at(j));
    erased[j] = e == EraseHome::kErased;
    if (e == EraseHome::kDeferred) deferred.push_back(j);
  };
  prefetched_loop<Touches::kRead, RowUse::kNone, kReadGroup>(t, 0, n, key_at, body);
  erase_deferred(t, keys, deferred, erased);
}

/// Erases a batch on several threads by the two passes of core/tile_erase.h: pass 1
/// split by home-bucket range like upserts (a thread owns its range), pass 2 (the keys
/// absent from a flagged home, which may sit in a second bucket of another range) on
/// one thread after it, so without locks. Unlike upserts, erase
/// reads no row and outputs one byte per key, so run_partitioned's passes (~26
/// bytes written per key) would cost a third of its time. Instead each thread walks
/// the whole batch a block at a time: it picks the block's keys of its range (a
/// hash loop gcc vectorizes, then a branchless gather), erases them in batch order
/// (so a repeated key's first occurrence reports it) and sets their bits in its own
/// bitmap; the bitmaps are or-ed into `erased` at the end (the threads' bytes would
/// share output lines key after key). Nothing is written per key but the table and
/// the outcome. The other threads' keys cost each thread a hash (~0.3 ns a key),
/// small beside an erase (~16 ns) while threads are few.
template <class V>
void erase_split(const TableRef<V>& t, const int64_t* keys, int64_t n, int threads,
                 bool* erased) {
  const int64_t words = (n + 63) / 64;
  std::vector<std::vector<uint64_t>> bits(threads);
  std::vector<std::vector<int64_t>> deferred(threads);  // each in batch order
#pragma omp parallel num_threads(threads)
  {
    const int T = omp_get_num_threads();
    const int c = omp_get_thread_num();
    const int64_t first = (t.num_buckets * c + T - 1) / T;  // home buckets of thread c
    const int64_t last = (t.num_buckets * (c + 1) + T - 1) / T;
    constexpr int64_t kBlock = 4096;
    uint8_t in_range[kBlock];
    int64_t own_index[kBlock];
    int64_t own_key[kBlock];
    std::vector<uint64_t>& mine = bits[c];
    mine.assign(words, 0);
    for (int64_t begin = 0; begin < n; begin += kBlock) {
      const int64_t m = std::min(kBlock, n - begin);
      for (int64_t k = 0; k < m; ++k) {
        const int64_t b = bucket_of(hash_key(keys[begin + k]), t.num_buckets);
        in_range[k] = static_cast<uint8_t>((b >= first) & (b < last));
      }
      int64_t count = 0;
      for (int64_t k = 0; k < m; ++k) {
        own_index[count] = begin + k;
        own_key[count] = keys[begin + k];
        count += in_range[k];
      }
      auto key_at = [&](int64_t x) { return own_key[x]; };
      auto body = [&](int64_t x, int64_t) {
        const EraseHome e = tile_erase_home(SerialTile{}, t, own_key[x]);
        mine[own_index[x] >> 6] |= uint64_t{e == EraseHome::kErased} << (own_index[x] & 63);
        if (e == EraseHome::kDeferred) deferred[c].push_back(own_index[x]);
      };
      prefetched_loop<Touches::kRead, RowUse::kNone, kReadGroup>(t, 0, count, key_at, body);
    }
#pragma omp barrier
    for (int64_t w = words * c / T; w < words * (c + 1) / T; ++w) {
      uint64_t any = 0;
      for (int p = 0; p < T; ++p) any |= bits[p][w];
      for (int64_t k = 0; k < std::min<int64_t>(64, n - w * 64); ++k) {
        erased[w * 64 + k] = (any >> k) & 1;
      }
    }
  }
  erase_deferred(t, keys, merged_in_order(deferred), erased);
}

}  // namespace

template <class V>
void erase(const TableRef<V>& t, const int64_t* keys, int64_t n, bool* erased) {
  const int threads = threads_for(n);
  if (threads == 1) {
    erase_sequence(t, keys, n, erased);
  } else {
    erase_split(t, keys, n, threads, erased);
  }
}

/// The batch rule for a rehash (core/tile_rehash.h, by the one lane of a SerialTile):
/// pass 1 places every entry in its new home bucket up to its limit (tile_place_home),
/// the entries of one home bucket in source-slot order: each thread owns a range of
/// destination home buckets and picks its entries from the whole source (a hash per
/// entry), as a GPU tile owns its range. Pass 2 places what did not fit
/// (tile_place_moved over the window) in source-slot order, on one thread.
template <class V>
int64_t rehash(const TableRef<V>& src, const TableRef<V>& dst, int window) {
  const SerialTile one;
  const int64_t num_slots = src.num_slots();
  const int threads = threads_for(num_slots);
  std::vector<std::vector<int64_t>> deferred(threads);
#pragma omp parallel num_threads(threads)
  {
    const int T = omp_get_num_threads();
    const int c = omp_get_thread_num();
    const int64_t first = (dst.num_buckets * c + T - 1) / T;  // home buckets of thread c
    const int64_t last = (dst.num_buckets * (c + 1) + T - 1) / T;
    for (int64_t s = 0; s < num_slots; ++s) {
      if (src.digest(s) == kEmptyDigest) continue;
      const int64_t b = bucket_of(hash_key(src.key(s)), dst.num_buckets);
      if (b < first || b >= last) continue;
      if (tile_place_home(one, dst, src, s, window) < 0) deferred[c].push_back(s);
    }
  }
  int64_t failed = 0;
  for (const int64_t s : merged_in_order(deferred)) {
    failed += tile_place_moved(one, dst, src, s, window) < 0;
  }
  return failed;
}

template <class V>
void cache_exchange(const TableRef<V>& cache, const TableRef<V>& slow, const CacheExchange<V>& x) {
  // Two passes, the victims' rows streaming out first (a few % faster than both
  // steps per key in one loop); each prefetches the cache rows a group ahead.
  constexpr int64_t kAhead = kWriteGroup;  // rows prefetched this many keys ahead
  const int64_t row_bytes = cache.row_width * static_cast<int64_t>(sizeof(V));
  auto slot_of = [&](int64_t j) { return x.slots[x.moved[j]]; };
  at::parallel_for(0, x.m, kGrain, [&](int64_t begin, int64_t end) {
    for (int64_t j = begin; j < end; ++j) {
      const int64_t ahead = j + kAhead;
      if (ahead < end && x.victim_index[ahead] >= 0) {
        P::prefetch_lines(cache.row(slot_of(ahead)), row_bytes);
      }
      save_victim(cache, x, j);
    }
  });
  at::parallel_for(0, x.m, kGrain, [&](int64_t begin, int64_t end) {
    auto key_at = [&](int64_t j) { return x.keys[x.moved[j]]; };
    auto body = [&](int64_t j, int64_t hint) {
      if (j + kAhead < end) P::prefetch_lines_for_write(cache.row(slot_of(j + kAhead)), row_bytes);
      fetch_entry(cache, slow, x, j, hint);
    };
    prefetched_loop<Touches::kRead, RowUse::kAll, kWriteGroup>(slow, begin, end, key_at, body);
  });
}

#define DYNEMB_INSTANTIATE(V)                                                \
  template void erase<V>(const TableRef<V>&, const int64_t*, int64_t, bool*); \
  template int64_t rehash<V>(const TableRef<V>&, const TableRef<V>&, int);     \
  template void cache_exchange<V>(const TableRef<V>&, const TableRef<V>&, const CacheExchange<V>&);

DYNEMB_INSTANTIATE(float)
DYNEMB_INSTANTIATE(c10::Half)
DYNEMB_INSTANTIATE(c10::BFloat16)

}  // namespace dynemb::cpu
