// dynemb CPU executor: see executor_cpu.h.
#include "cpu/executor_cpu.h"

#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <omp.h>

#include <algorithm>
#include <memory>
#include <type_traits>
#include <vector>

#include "cpu/cpu_platform.h"

namespace dynemb::cpu {

using P = CpuPlatform;

namespace {

constexpr int64_t kGrain = 2048;  // keys per task below which one thread runs a batch

// Batch loops overlap the cache misses of many keys (software-pipelined group
// prefetching): keys go in groups of kGroup; while group g is processed, the key,
// score and row of each key's likely slot are prefetched for group g + 1 (whose
// digests arrived meanwhile) and the digests (the key's home line or the whole
// bucket, see BucketSpan) and lock for group g + 2.
constexpr int64_t kGroup = 8;

int threads_for(int64_t n) {
  return n < 2 * kGrain ? 1 : std::max(1, at::get_num_threads());
}

/// Writes rows into a caller's output with non-temporal stores: they skip the read
/// for ownership of each output line (4 of the ~10 lines a find+gather key moves)
/// and leave the table's lines in the cache. Rows that are not whole 16-byte
/// chunks at 16-byte boundaries get plain stores. A loop that used it ends with
/// P::store_fence().
struct StreamingStore {
  template <class V>
  static void row(const V* src, V* dst, int64_t n) {
    const int64_t bytes = n * static_cast<int64_t>(sizeof(V));
    if ((reinterpret_cast<uintptr_t>(dst) | static_cast<uintptr_t>(bytes)) % 16 != 0) {
      copy_row(src, dst, n);
    } else {
      P::stream_copy(dst, src, bytes);
    }
  }
};

/// Outputs larger than this are written with StreamingStore: their lines would
/// leave the cache before anyone reads them, so fetching them first is wasted;
/// smaller outputs stay cached for the caller's next op. It is the last-level
/// cache of one core complex of current server CPUs (32 MiB; sysconf's figure can
/// be a whole package's, 384 MiB on our VMs, where no thread sees that much).
constexpr int64_t kStreamedOutputBytes = int64_t{32} << 20;

bool streams_output(int64_t bytes) { return bytes > kStreamedOutputBytes; }

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

/// Prefetches the digest lines of `bucket` except the one holding `skip` (or none).
template <class V>
DYNEMB_INLINE void prefetch_bucket_lines(const TableRef<V>& t, int64_t bucket,
                                         const uint8_t* skip) {
  const uint8_t* first = t.digests + bucket * t.bucket_capacity;
  const auto line_of = [](const uint8_t* p) { return reinterpret_cast<uintptr_t>(p) / 64; };
  const uintptr_t skipped = skip ? line_of(skip) : 0;
  for (uintptr_t line = line_of(first); line <= line_of(first + t.bucket_capacity - 1); ++line) {
    if (line != skipped) P::prefetch(reinterpret_cast<const void*>(line * 64));
  }
}

// kWrites: the loop changes the table (upserts), so also fetch the bucket lock (owned)
// and the slot's score; a read-only loop leaves them out to save memory traffic.
template <bool kWrites, class V>
DYNEMB_INLINE void prefetch_digests(const TableRef<V>& t, int64_t key, const BucketSpan& span) {
  const uint64_t h = hash_key(key);
  const int64_t b = bucket_of(h, t.num_buckets);
  if (span.whole()) {
    prefetch_bucket_lines(t, b, nullptr);
  } else {
    P::prefetch(t.digests + b * t.bucket_capacity + 16 * ProbeOrder(h, t.bucket_capacity).home);
  }
  if (kWrites) P::prefetch_for_write(t.locks + b);
}

/// Which value rows a loop body touches, so that prefetching fetches only those:
/// rows are 4+ cache lines each, and needless ones fill the line-fill buffers and
/// stall every prefetch behind them.
enum class RowUse { kNone, kNewOnly, kAll };

/// Prefetches the likely slot of key; @return it (-1 if none), a hint for find_slot_hinted.
/// When the home line holds no match, the likely slot is sought in the whole bucket
/// if `span` prefetched it, else the bucket's other lines are prefetched for the body.
template <bool kWrites, RowUse kRows, class V>
DYNEMB_INLINE int64_t prefetch_slot(const TableRef<V>& t, int64_t key, BucketSpan& span) {
  const uint64_t h = hash_key(key);
  const int64_t b = bucket_of(h, t.num_buckets);
  const ProbeOrder order(h, t.bucket_capacity);
  const uint8_t digest = digest_of(h);
  int64_t slot = likely_slot<P>(t, b, digest, order, kLineGroups);
  span.count(slot < 0);
  if (slot < 0 || t.digests[slot] != digest) {  // no match in the home line
    if (span.whole()) {
      slot = likely_slot<P>(t, b, digest, order, order.span);
    } else {
      prefetch_bucket_lines(t, b, t.digests + b * t.bucket_capacity + 16 * order.home);
    }
  }
  if (slot < 0) {
    // A full bucket without a match: an upsert of a new key scans every score for
    // its victim (bucket_victim).
    if (kWrites && t.scores && span.whole()) {
      const uint64_t* first = t.scores + b * t.bucket_capacity;
      for (int64_t s = 0; s < t.bucket_capacity; s += 8) P::prefetch(first + s);
    }
    return slot;
  }
  P::prefetch(t.keys + slot);
  if (kWrites && t.scores) P::prefetch(t.scores + slot);
  const bool is_new = t.digests[slot] == kEmptyDigest;  // likely_slot found no match
  if (kRows == RowUse::kAll || (kRows == RowUse::kNewOnly && is_new)) {
    const char* row = reinterpret_cast<const char*>(t.row(slot));
    const int64_t bytes = t.row_width * static_cast<int64_t>(sizeof(V));
    for (int64_t off = 0; off < bytes; off += 64) P::prefetch(row + off);
  }
  return slot;
}

/// Calls body(j, hint) for j in [begin, end) in order, prefetching group by group;
/// key_at(j) is the key body(j) will look up and hint its likely slot (or -1).
template <bool kWrites, RowUse kRows, class V, class KeyAt, class Body>
DYNEMB_INLINE void prefetched_loop(const TableRef<V>& t, int64_t begin, int64_t end,
                                   KeyAt&& key_at, Body&& body) {
  int64_t hints[2 * kGroup];  // hint of j at hints[(j - begin) % (2 * kGroup)]
  BucketSpan span;
  auto digests = [&](int64_t from) {
    for (int64_t j = from; j < std::min(end, from + kGroup); ++j) {
      prefetch_digests<kWrites>(t, key_at(j), span);
    }
  };
  auto slots = [&](int64_t from) {
    for (int64_t j = from; j < std::min(end, from + kGroup); ++j) {
      hints[(j - begin) % (2 * kGroup)] = prefetch_slot<kWrites, kRows>(t, key_at(j), span);
    }
  };
  digests(begin);
  digests(begin + kGroup);
  slots(begin);
  for (int64_t g = begin; g < end; g += kGroup) {
    digests(g + 2 * kGroup);
    slots(g + kGroup);
    for (int64_t j = g; j < std::min(end, g + kGroup); ++j) {
      body(j, hints[(j - begin) % (2 * kGroup)]);
    }
  }
}

/// False for a SlotSink that leaves new rows to its caller: no row is touched.
template <class Sink>
bool touches_new_rows(const Sink& sink) {
  if constexpr (requires { sink.init_rows; }) return sink.init_rows;
  return true;
}

/// Sinks that read a caller's row per key (AssignSink's in).
template <class Sink>
concept ReadsInputRows = requires(Sink s) { s.in + s.in_width; };

/// Runs upsert for keys[i], i = order[j] for j in [begin, end) (or i = j when order
/// is null), one thread; outputs go to position j (status[j], the sink's o = j).
/// Q is the platform of the upsert: CpuExclusivePlatform when this thread is the
/// only one touching the buckets its keys may change (see upsert_batch).
template <class Q, class V, class Sink>
void upsert_sequence(const TableRef<V>& t, Sink sink, const UpsertArgs& args,
                     const int64_t* keys, const int64_t* order, int64_t begin, int64_t end,
                     int8_t* status, StatusCounts& counts) {
  auto index_of = [&](int64_t j) { return order ? order[j] : j; };
  // Positions to upsert: [begin, end), or with hits_first those whose key pass 1
  // found absent (pending[x] for x in [0, size)).
  std::vector<int64_t> pending;
  if (args.hits_first) {
    auto key_at = [&](int64_t j) { return keys[index_of(j)]; };
    prefetched_loop<true, RowUse::kNone>(t, begin, end, key_at, [&](int64_t j, int64_t hint) {
      const int64_t i = index_of(j);
      if (touch_stored<Q>(t, i, j, keys[i], args, sink, hint)) {
        status[j] = static_cast<int8_t>(Status::kHit);
        ++counts.by_status[static_cast<int>(Status::kHit)];
      } else {
        pending.push_back(j);
      }
    });
  }
  const bool all = !args.hits_first;
  auto position = [&](int64_t x) { return all ? x : pending[x]; };
  auto key_at = [&](int64_t x) { return keys[index_of(position(x))]; };
  const int64_t first = all ? begin : 0;
  const int64_t last = all ? end : static_cast<int64_t>(pending.size());
  auto body = [&](int64_t x, int64_t hint) {
    if constexpr (ReadsInputRows<Sink>) {
      // In partition order the caller's rows are read out of order, beyond what the
      // hardware prefetcher follows: fetch the row of the key one group ahead.
      if (order && x + kGroup < last) {
        const V* ahead = sink.in + index_of(position(x + kGroup)) * sink.in_width;
        const int64_t bytes = sink.in_width * static_cast<int64_t>(sizeof(V));
        for (int64_t off = 0; off < bytes; off += 64) {
          P::prefetch(reinterpret_cast<const char*>(ahead) + off);
        }
      }
    }
    const int64_t j = position(x);
    const int64_t i = index_of(j);
    const Status s = upsert<Q>(t, i, j, keys[i], args, sink, hint);
    status[j] = static_cast<int8_t>(s);
    ++counts.by_status[static_cast<int>(s)];
  };
  if constexpr (Sink::kRowOnHit) {
    prefetched_loop<true, RowUse::kAll>(t, first, last, key_at, body);
  } else if (touches_new_rows(sink)) {
    prefetched_loop<true, RowUse::kNewOnly>(t, first, last, key_at, body);
  } else {
    prefetched_loop<true, RowUse::kNone>(t, first, last, key_at, body);
  }
  P::store_fence();  // the sink may have streamed rows (StreamingStore)
}

/// Sinks whose per-key outputs go to position o (SlotSink's slots): partitioned
/// batches give them a buffer in partition order and restore batch order after.
template <class Sink>
concept SlotOutputs = requires(Sink s) { s.slots; };

/// Runs a mutating batch partitioned by home-bucket range (see executor_cpu.h) on
/// `threads` threads. Thread c calls work(c, order, begin, end): partition positions
/// [begin, end) hold its keys, order[j] being the batch index at position j; it
/// writes per-key outputs at positions. After a barrier, each thread calls
/// restore(lo, hi, position) for an even range [lo, hi) of batch indices, position[i]
/// being the partition position of batch index i, to move outputs to batch order:
/// writing at batch positions directly would make the threads store into the same
/// cache lines, key after key.
///
/// Bucket locks: the Python owner runs one mutating batch at a time and no reader
/// beside it (dynemb/table/rw_lock.py), so only the threads of this batch compete.
/// One thread alone needs no lock; nor do several when keys only ever touch their
/// home bucket (strategies that evict never spill), since each thread owns a range
/// of home buckets. NO_EVICTION keys may spill into the next buckets, which can
/// belong to the next thread's range: those batches keep the locks.
template <class V, class Work, class Restore>
void run_partitioned(const TableRef<V>& t, const int64_t* keys, int64_t n, int threads,
                     Work&& work, Restore&& restore) {
  std::vector<int64_t> order(n);     // order[j]: batch index of partition position j
  std::vector<int64_t> position(n);  // its inverse
  // count[c * T + p]: keys of chunk c in part p, then the first position of those.
  std::vector<int64_t> count(static_cast<size_t>(threads) * threads, 0);
  std::vector<int64_t> part_begin(threads + 1, 0);
#pragma omp parallel num_threads(threads)
  {
    const int T = omp_get_num_threads();
    const int c = omp_get_thread_num();
    const int64_t lo = n * c / T, hi = n * (c + 1) / T;
    std::vector<int64_t> mine(T, 0);  // this chunk's counts, then cursors (not shared)
    auto part_of = [&](int64_t i) {
      return bucket_of(hash_key(keys[i]), t.num_buckets) * T / t.num_buckets;
    };
    for (int64_t i = lo; i < hi; ++i) ++mine[part_of(i)];
    for (int p = 0; p < T; ++p) count[c * T + p] = mine[p];
#pragma omp barrier
#pragma omp single
    {
      // Exclusive prefix sum in (part, chunk) order keeps batch order inside a part.
      int64_t running = 0;
      for (int p = 0; p < T; ++p) {
        part_begin[p] = running;
        for (int cc = 0; cc < T; ++cc) {
          const int64_t k = count[cc * T + p];
          count[cc * T + p] = running;
          running += k;
        }
      }
      part_begin[T] = running;
    }
    for (int p = 0; p < T; ++p) mine[p] = count[c * T + p];
    for (int64_t i = lo; i < hi; ++i) {
      const int64_t j = mine[part_of(i)]++;
      order[j] = i;
      position[i] = j;
    }
#pragma omp barrier
    work(c, order.data(), part_begin[c], part_begin[c + 1]);
#pragma omp barrier
    restore(lo, hi, position.data());
  }
}

/// Upserts a batch, partitioned by home-bucket range (run_partitioned).
template <class V, class Sink>
StatusCounts upsert_batch(const TableRef<V>& t, const Sink& sink, const UpsertArgs& args,
                         const int64_t* keys, int64_t n, int8_t* status) {
  const int max_threads = threads_for(n);
  StatusCounts total;
  if (max_threads == 1) {
    upsert_sequence<CpuExclusivePlatform>(t, sink, args, keys, nullptr, 0, n, status, total);
    return total;
  }
  const bool exclusive = evicts(args.score.strategy);
  std::vector<int8_t> status_by_position(n);
  Sink by_position = sink;
  std::vector<int64_t> slots_by_position;
  if constexpr (SlotOutputs<Sink>) {
    slots_by_position.resize(n);
    by_position.slots = slots_by_position.data();
  }
  std::vector<StatusCounts> counts(max_threads);
  auto work = [&](int c, const int64_t* order, int64_t begin, int64_t end) {
    if (exclusive) {
      upsert_sequence<CpuExclusivePlatform>(t, by_position, args, keys, order, begin, end,
                                            status_by_position.data(), counts[c]);
    } else {
      upsert_sequence<P>(t, by_position, args, keys, order, begin, end,
                         status_by_position.data(), counts[c]);
    }
  };
  auto restore = [&](int64_t lo, int64_t hi, const int64_t* position) {
    for (int64_t i = lo; i < hi; ++i) {
      status[i] = status_by_position[position[i]];
      if constexpr (SlotOutputs<Sink>) sink.slots[i] = slots_by_position[position[i]];
    }
  };
  run_partitioned(t, keys, n, max_threads, work, restore);
  for (const StatusCounts& c : counts) {
    for (int s = 0; s < 4; ++s) total.by_status[s] += c.by_status[s];
  }
  return total;
}

/// Erases keys[order[j]] (or keys[j] when order is null) for j in [begin, end), one
/// thread, erased[j] the outcome; Q as in upsert_sequence.
template <class Q, class V>
void erase_sequence(const TableRef<V>& t, const int64_t* keys, const int64_t* order,
                    int64_t begin, int64_t end, bool* erased) {
  auto key_at = [&](int64_t j) { return keys[order ? order[j] : j]; };
  // Prefetches the digests and the likely key; no lock line (mostly none is taken) nor
  // score or row (erase reads neither).
  prefetched_loop<false, RowUse::kNone>(t, begin, end, key_at, [&](int64_t j, int64_t) {
    erased[j] = erase_key<Q>(t, key_at(j));
  });
}

}  // namespace

/// Sinks that copy rows into the caller's output (with PlainStore).
template <class Sink>
constexpr bool kCopiesRowsOut = false;
template <class V>
constexpr bool kCopiesRowsOut<FindOrInsertSink<V>> = true;

template <class Sink>
StatusCounts upsert_keys(const Sink& sink, const UpsertArgs& args, const int64_t* keys, int64_t n,
                         int8_t* status) {
  if constexpr (kCopiesRowsOut<Sink>) {
    using V = std::remove_pointer_t<decltype(sink.out)>;
    if (streams_output(n * sink.out_width * static_cast<int64_t>(sizeof(V)))) {
      const FindOrInsertSink<V, StreamingStore> streaming{sink.t,   sink.init,      sink.dim,
                                                          sink.out, sink.out_width, sink.evicted};
      return upsert_batch(sink.t, streaming, args, keys, n, status);
    }
  }
  return upsert_batch(sink.t, sink, args, keys, n, status);
}

void hash_keys(const int64_t* keys, int64_t n, int64_t num_buckets, int64_t* bucket,
               uint8_t* digest) {
  at::parallel_for(0, n, kGrain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const uint64_t h = hash_key(keys[i]);
      bucket[i] = bucket_of(h, num_buckets);
      digest[i] = digest_of(h);
    }
  });
}

/// find, writing found rows with Store (PlainStore or StreamingStore).
template <class Store, class V>
void find_rows(const TableRef<V>& t, const int64_t* keys, int64_t n, V* out, int64_t out_width,
               bool* found) {
  at::parallel_for(0, n, kGrain, [&](int64_t begin, int64_t end) {
    auto key_at = [&](int64_t j) { return keys[j]; };
    prefetched_loop<false, RowUse::kAll>(t, begin, end, key_at, [&](int64_t i, int64_t hint) {
      const int64_t slot = find_slot_hinted<P>(t, keys[i], hint);
      found[i] = slot >= 0;
      V* dst = out + i * out_width;
      if (slot >= 0) {
        Store::row(t.row(slot), dst, out_width);
      } else {
        for (int64_t j = 0; j < out_width; ++j) dst[j] = V(0);
      }
    });
    P::store_fence();
  });
}

template <class V>
void find(const TableRef<V>& t, const int64_t* keys, int64_t n, V* out, int64_t out_width,
          bool* found) {
  if (streams_output(n * out_width * static_cast<int64_t>(sizeof(V)))) {
    find_rows<StreamingStore>(t, keys, n, out, out_width, found);
  } else {
    find_rows<PlainStore>(t, keys, n, out, out_width, found);
  }
}

template <class V>
void find_slots(const TableRef<V>& t, const int64_t* keys, int64_t n, int64_t* slots) {
  at::parallel_for(0, n, kGrain, [&](int64_t begin, int64_t end) {
    auto key_at = [&](int64_t j) { return keys[j]; };
    prefetched_loop<false, RowUse::kNone>(t, begin, end, key_at,
                           [&](int64_t i, int64_t hint) {
                             slots[i] = find_slot_hinted<P>(t, keys[i], hint);
                           });
  });
}

/// Partitioned by home-bucket range like upserts, hence without locks where keys stay
/// in their home bucket: tables that keep scores (only NO_EVICTION, which keeps
/// none, spills; see table_ref.h).
template <class V>
void erase(const TableRef<V>& t, const int64_t* keys, int64_t n, bool* erased) {
  const int max_threads = threads_for(n);
  if (max_threads == 1) {
    erase_sequence<CpuExclusivePlatform>(t, keys, nullptr, 0, n, erased);
    return;
  }
  const bool exclusive = t.scores != nullptr;
  const std::unique_ptr<bool[]> erased_by_position(new bool[n]);
  auto work = [&](int, const int64_t* order, int64_t begin, int64_t end) {
    if (exclusive) {
      erase_sequence<CpuExclusivePlatform>(t, keys, order, begin, end, erased_by_position.get());
    } else {
      erase_sequence<P>(t, keys, order, begin, end, erased_by_position.get());
    }
  };
  auto restore = [&](int64_t lo, int64_t hi, const int64_t* position) {
    for (int64_t i = lo; i < hi; ++i) erased[i] = erased_by_position[position[i]];
  };
  run_partitioned(t, keys, n, max_threads, work, restore);
}

/// Prefetches the lines of a row (for reading, or `for_write`).
template <class V>
DYNEMB_INLINE void prefetch_row(const TableRef<V>& t, int64_t slot, bool for_write) {
  const char* row = reinterpret_cast<const char*>(t.row(slot));
  const int64_t bytes = t.row_width * static_cast<int64_t>(sizeof(V));
  for (int64_t off = 0; off < bytes; off += 64) {
    if (for_write) {
      P::prefetch_for_write(row + off);
    } else {
      P::prefetch(row + off);
    }
  }
}

template <class V>
void cache_exchange(const TableRef<V>& cache, const TableRef<V>& slow, const CacheExchange<V>& x) {
  // Two passes, the victims' rows streaming out first (a few % faster than both
  // steps per key in one loop); each prefetches the cache rows a group ahead.
  at::parallel_for(0, x.n, kGrain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const int64_t ahead = i + kGroup;
      if (ahead < end && x.victim_index[ahead] >= 0) prefetch_row(cache, x.slots[ahead], false);
      save_victim(cache, x, i);
    }
  });
  at::parallel_for(0, x.n, kGrain, [&](int64_t begin, int64_t end) {
    auto key_at = [&](int64_t j) { return x.keys[j]; };
    prefetched_loop<false, RowUse::kAll>(slow, begin, end, key_at, [&](int64_t i, int64_t hint) {
      if (i + kGroup < end) prefetch_row(cache, x.slots[i + kGroup], true);
      fetch_entry<P>(cache, slow, x, i, hint);
    });
  });
}

template <class V>
int64_t rehash(const TableRef<V>& src, const TableRef<V>& dst, int window) {
  std::vector<int64_t> failed(std::max(1, at::get_num_threads()), 0);
  at::parallel_for(0, src.num_buckets, 64, [&](int64_t begin, int64_t end) {
    int64_t lost = 0;
    for (int64_t s = begin * src.bucket_capacity; s < end * src.bucket_capacity; ++s) {
      if (src.digests[s] == kEmptyDigest) continue;
      const uint64_t score = src.scores ? src.scores[s] : 0;
      const uint64_t stamp = src.timestamps ? src.timestamps[s] : 0;
      const int64_t slot = place_moved<P>(dst, src.keys[s], score, stamp, window);
      if (slot < 0) {
        ++lost;
        continue;
      }
      copy_row(src.row(s), dst.row(slot), src.row_width);
    }
    failed[at::get_thread_num()] += lost;
  });
  int64_t total = 0;
  for (int64_t f : failed) total += f;
  return total;
}

#define DYNEMB_INSTANTIATE(V)                                                                 \
  template void find<V>(const TableRef<V>&, const int64_t*, int64_t, V*, int64_t, bool*);     \
  template void find_slots<V>(const TableRef<V>&, const int64_t*, int64_t, int64_t*);         \
  template StatusCounts upsert_keys(const FindOrInsertSink<V>&, const UpsertArgs&,            \
                                    const int64_t*, int64_t, int8_t*);                        \
  template StatusCounts upsert_keys(const AssignSink<V>&, const UpsertArgs&, const int64_t*,   \
                                    int64_t, int8_t*);                                        \
  template StatusCounts upsert_keys(const SlotSink<V>&, const UpsertArgs&, const int64_t*,     \
                                    int64_t, int8_t*);                                        \
  template StatusCounts upsert_keys(const RestoreSink<V>&, const UpsertArgs&, const int64_t*,  \
                                    int64_t, int8_t*);                                        \
  template void erase<V>(const TableRef<V>&, const int64_t*, int64_t, bool*);                 \
  template int64_t rehash<V>(const TableRef<V>&, const TableRef<V>&, int);                    \
  template void cache_exchange<V>(const TableRef<V>&, const TableRef<V>&,                      \
                                  const CacheExchange<V>&);

DYNEMB_INSTANTIATE(float)
DYNEMB_INSTANTIATE(c10::Half)
DYNEMB_INSTANTIATE(c10::BFloat16)

}  // namespace dynemb::cpu
