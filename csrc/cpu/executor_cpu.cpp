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

#include "core/tile_ops.h"
#include "cpu/batch_threads.h"
#include "cpu/cpu_platform.h"
#include "cpu/prefetched_loop.h"
#include "cpu/streaming_store.h"
#include "cpu/victim_order.h"

namespace dynemb::cpu {

using P = CpuPlatform;

namespace {

/// False for a SlotSink that leaves new rows to its caller: no row is touched.
template <class Sink>
bool touches_new_rows(const Sink& sink) {
  if constexpr (requires { sink.init_rows; }) return sink.init_rows;
  return true;
}

/// True for a sink whose Store streams new rows into the table (nothing to prefetch).
template <class Sink>
bool new_rows_streamed(const Sink& sink) {
  if constexpr (requires { Sink::Store::streams_new_rows(sink.t); }) {
    return Sink::Store::streams_new_rows(sink.t);
  }
  return false;
}

/// True for an AssignSink whose Store streams every row it writes whole: nothing to
/// prefetch (see upsert_keys).
template <class Sink>
bool assigned_rows_streamed(const Sink& sink) {
  if constexpr (requires { sink.in_width; }) {
    return new_rows_streamed(sink) && sink.in_width == sink.t.row_width;
  }
  return false;
}

template <RowUse kUse>
constexpr std::integral_constant<RowUse, kUse> kRows{};

/// Sinks that read a caller's row per key (AssignSink's in).
template <class Sink>
concept ReadsInputRows = requires(Sink s) { s.in + s.in_width; };

/// Writes the new rows of the positions `placed` whose status says a new key took a
/// slot (sink.slots[j]), in one loop after their placements: each row is fetched for
/// writing kAhead keys ahead. Written where its slot was chosen, a row's stores each
/// waited on the read for ownership of a line seldom cached (a victim's row), and
/// init_row stalled on them (7% of the evicting W-train step).
template <class V>
void init_new_rows(const TableRef<V>& t, const SlotSink<V>& sink, const int64_t* keys,
                   const std::vector<int64_t>& placed, const int8_t* status) {
  constexpr int64_t kAhead = 8;
  const int64_t bytes = t.row_width * static_cast<int64_t>(sizeof(V));
  auto is_new = [&](int64_t j) {
    const auto s = static_cast<Status>(status[j]);
    return s == Status::kInserted || s == Status::kEvicted;
  };
  const auto n = static_cast<int64_t>(placed.size());
  for (int64_t x = 0; x < n; ++x) {
    if (x + kAhead < n && is_new(placed[x + kAhead])) {
      P::prefetch_lines_for_write(t.row(sink.slots[placed[x + kAhead]]), bytes);
    }
    const int64_t j = placed[x];
    if (is_new(j)) sink.write_new_row(sink.slots[j], keys[j]);
  }
}

/// The victims of a distinct batch's pass 1 (victim_levels_apply), bucket by bucket:
/// the positions `pending` (new keys whose home bucket is full, in position order)
/// grouped by home bucket with a counting sort (position order kept within one); a
/// bucket with several takes them from BucketVictims (victim_order.h), a lone key
/// from its own scan (tile_place_by_victim). The victims are those of
/// tile_place_by_victim in position order: buckets are independent in pass 1. Returns
/// false, having changed nothing, when the keys spread over more than two buckets each
/// (mostly lone keys).
///
/// A SlotSink that writes new rows writes them after the placements, in one loop that
/// fetches each row for writing a few keys ahead (init_new_rows).
template <class V, class Sink, class IndexOf>
bool place_by_bucket_victims(const TableRef<V>& t, Sink& sink, const UpsertArgs& args,
                             const int64_t* keys, IndexOf&& index_of,
                             const std::vector<int64_t>& pending, int8_t* status,
                             StatusCounts& counts) {
  if constexpr (std::is_same_v<Sink, SlotSink<V>>) {
    if (sink.init_rows) {
      SlotSink<V> slots_only = sink;
      slots_only.init_rows = false;
      if (!place_by_bucket_victims(t, slots_only, args, keys, index_of, pending, status, counts)) {
        return false;
      }
      init_new_rows(t, sink, keys, pending, status);
      return true;
    }
  }
  const auto n = static_cast<int64_t>(pending.size());
  if (n == 0) return true;
  std::vector<KeyProbe> probe(n);  // of the key at position pending[x]
  int64_t lo = t.num_buckets;
  int64_t hi = -1;
  for (int64_t x = 0; x < n; ++x) {
    probe[x] = KeyProbe(t, keys[pending[x]]);
    lo = std::min(lo, probe[x].bucket);
    hi = std::max(hi, probe[x].bucket);
  }
  if (hi - lo + 1 > 2 * n) return false;
  auto bucket = [&](int64_t x) { return probe[x].bucket; };
  std::vector<int32_t> start(hi - lo + 2, 0);
  for (int64_t x = 0; x < n; ++x) ++start[bucket(x) - lo + 1];
  for (int64_t b = 1; b < hi - lo + 2; ++b) start[b] += start[b - 1];
  std::vector<int64_t> grouped(n);
  for (int64_t x = 0; x < n; ++x) grouped[start[bucket(x) - lo]++] = x;
  const uint64_t mask = pin_mask(args.score.strategy);
  std::vector<int32_t> scratch(2 * t.bucket_capacity);
  auto prefetch_bucket = [&](int64_t b) {
    const int64_t first = b * t.bucket_capacity;
    P::prefetch_lines(t.digests + first, t.bucket_capacity);
    P::prefetch_lines(t.scores + first, t.bucket_capacity * int64_t{sizeof(uint64_t)});
    P::prefetch_lines(t.pins + first, t.bucket_capacity * int64_t{sizeof(uint32_t)});
  };
  // Places the key at position pending[x] by victim_of(i, j, its probe).
  auto place = [&](int64_t x, auto&& victim_of) {
    const int64_t j = pending[x];
    const Status s = victim_of(index_of(j), j, probe[x]);
    status[j] = static_cast<int8_t>(s);
    ++counts.by_status[static_cast<int>(s)];
  };
  const SerialTile one;
  for (int64_t g = 0; g < n;) {
    const int64_t b = bucket(grouped[g]);
    int64_t e = g + 1;
    while (e < n && bucket(grouped[e]) == b) ++e;
    if (e < n) prefetch_bucket(bucket(grouped[e]));
    if (e - g == 1) {
      place(grouped[g], [&](int64_t i, int64_t j, const KeyProbe& p) {
        return tile_place_by_victim(one, t, i, j, keys[j], p, args, sink);
      });
    } else {
      BucketVictims<V> victims(t, b, mask, args.evict_below, args.pin_floor, scratch);
      for (int64_t k = g; k < e; ++k) {
        place(grouped[k], [&](int64_t i, int64_t j, const KeyProbe& p) {
          const Status s = tile_place_at(one, t, i, j, keys[j], p, args, sink, -1, victims.front());
          if (s == Status::kEvicted) victims.pop();
          return s;
        });
      }
    }
    g = e;
  }
  return true;
}

/// Pass 0's answer for one key (choose_buckets), in one word: the bucket its pass 1
/// runs in, or ~slot when pass 0 found the key stored in `slot` (that slot's bucket),
/// whose pass 1 is then tile_hit_stored, without a second probe.
struct Choice {
  static int64_t of_stored(int64_t slot) { return ~slot; }
  /// The slot pass 0 found the key stored in, or -1.
  static int64_t stored(int64_t c) { return c < 0 ? ~c : -1; }
  template <class V>
  static int64_t bucket(const TableRef<V>& t, int64_t c) {
    return c < 0 ? ~c / t.bucket_capacity : c;
  }
};

/// Runs upsert for the key at each position j in [begin, end), one thread: keys[j],
/// batch index i = order[j] (or i = j when order is null); outputs go to position j
/// (status[j], the sink's o = j). Keys come in position order, so that a partition
/// reads them in sequence.
/// Pass 1 of the batch rule (core/table_ops.h): tile_upsert_home; positions it leaves for
/// pass 2 are appended to `deferred`, in position order. `chosen`: pass 0's Choice for
/// each batch index, or null (every key's home).
template <class V, class Sink>
void upsert_sequence(const TableRef<V>& t, Sink sink, const UpsertArgs& args,
                     const int64_t* keys, const int64_t* order, int64_t begin, int64_t end,
                     int8_t* status, StatusCounts& counts, std::vector<int64_t>& deferred,
                     const int64_t* chosen) {
  auto index_of = [&](int64_t j) { return order ? order[j] : j; };
  const SerialTile one;  // the CPU's tile (core/tile_ops.h)
  // Positions to upsert: [begin, end), or under hits_first those the first pass
  // (tile_touch_or_place_free: hits and keys with a free home slot) left, which need a
  // victim (pending[x] for x in [0, size)).
  const bool first_hits = hits_first(args);
  std::vector<int64_t> pending;
  // victims: std::bool_constant, whether the loop's body looks for victims (the first
  // pass of hits_first leaves them to the second: it need not fetch a full bucket's
  // scores, which the second fetches again).
  auto run_loop = [&](auto victims, auto&& key_at, auto&& body, int64_t first, int64_t last,
                      auto&&... known_at) {
    auto loop = [&](auto rows) {  // rows: std::integral_constant<RowUse, ...>
      prefetched_loop<Touches::kWrite, decltype(rows)::value, kWriteGroup,
                      decltype(victims)::value>(t, first, last, key_at, body, known_at...);
    };
    if constexpr (Sink::kRowOnHit) {
      if (assigned_rows_streamed(sink)) {
        loop(kRows<RowUse::kNone>);
      } else if (new_rows_streamed(sink)) {
        loop(kRows<RowUse::kHitsOnly>);
      } else {
        loop(kRows<RowUse::kAll>);
      }
    } else if (touches_new_rows(sink)) {
      loop(kRows<RowUse::kNewOnly>);
    } else {
      loop(kRows<RowUse::kNone>);
    }
  };
  if (first_hits) {
    auto key_at = [&](int64_t j) { return keys[j]; };
    auto touch = [&](int64_t j, int64_t hint, const KeyProbe& probe) {
      const int64_t i = index_of(j);
      Status s;
      if (tile_touch_or_place_free(one, t, i, j, keys[j], probe, args, sink, &s, hint)) {
        status[j] = static_cast<int8_t>(s);
        ++counts.by_status[static_cast<int>(s)];
      } else {
        pending.push_back(j);
      }
    };
    run_loop(std::false_type{}, key_at, touch, begin, end);
  }
  const bool all = !first_hits;
  auto position = [&](int64_t x) { return all ? x : pending[x]; };
  const int64_t first = all ? begin : 0;
  const int64_t last = all ? end : static_cast<int64_t>(pending.size());
  if (chosen != nullptr) {  // NO_EVICTION after pass 0: each key in its chosen bucket
    auto probe_at = [&](int64_t x) {
      KeyProbe p(t, keys[x]);
      p.bucket = Choice::bucket(t, chosen[index_of(x)]);
      return p;
    };
    auto stored_at = [&](int64_t x) { return Choice::stored(chosen[index_of(x)]); };
    // Inlined into the loop: left out of line, it made upserts of stored keys 1.05x
    // slower (count_upsert_cpu.py --op slots, 4M slots).
    auto body = [&](int64_t x, int64_t hint, const KeyProbe& probe) DYNEMB_INLINE_LAMBDA {
      const int64_t i = index_of(x);
      Status s;
      if (Choice::stored(chosen[i]) >= 0) {  // hint: that slot (stored_at); probe: unset
        s = tile_hit_stored(one, t, i, x, hint, args, sink);
      } else if (args.distinct
                     ? !tile_place_new_chosen(one, t, i, x, keys[x], probe, args, sink, &s)
                     : !tile_upsert_home<true>(one, t, i, x, keys[x], probe, args, sink, &s,
                                               hint)) {
        deferred.push_back(x);
        return;
      }
      status[x] = static_cast<int8_t>(s);
      ++counts.by_status[static_cast<int>(s)];
    };
    if (first < last) run_loop(std::true_type{}, probe_at, body, first, last, stored_at);
    P::store_fence();
    return;
  }
  if (first_hits && victim_levels_apply(t, args) &&
      place_by_bucket_victims(t, sink, args, keys, index_of, pending, status, counts)) {
    P::store_fence();
    return;
  }
  auto key_at = [&](int64_t x) { return keys[position(x)]; };
  auto body = [&](int64_t x, int64_t hint, const KeyProbe& probe) {
    if constexpr (ReadsInputRows<Sink>) {
      // In partition order the caller's rows are read out of order, beyond what the
      // hardware prefetcher follows: fetch the row of the key one group ahead.
      if (order && x + kWriteGroup < last) {
        const V* ahead = sink.in + index_of(position(x + kWriteGroup)) * sink.in_width;
        P::prefetch_lines(ahead, sink.in_width * static_cast<int64_t>(sizeof(V)));
      }
    }
    const int64_t j = position(x);
    const int64_t i = index_of(j);
    Status s;
    if (first_hits && args.distinct) {
      s = tile_place_by_victim(one, t, i, j, keys[j], probe, args, sink);
      status[j] = static_cast<int8_t>(s);
      ++counts.by_status[static_cast<int>(s)];
    } else if (tile_upsert_home(one, t, i, j, keys[j], probe, args, sink, &s, hint)) {
      status[j] = static_cast<int8_t>(s);
      ++counts.by_status[static_cast<int>(s)];
    } else {
      deferred.push_back(j);
    }
  };
  if (first < last) run_loop(std::true_type{}, key_at, body, first, last);
  P::store_fence();  // the sink may have streamed rows (StreamingStore)
}

/// Pass 2 of the batch rule: tile_upsert_spill for the `deferred` positions, which are in
/// batch order, on this thread alone (so without locks); keys, order and outputs as
/// in upsert_sequence.
template <class V, class Sink>
void upsert_deferred(const TableRef<V>& t, Sink sink, const UpsertArgs& args,
                     const int64_t* keys, const int64_t* order,
                     const std::vector<int64_t>& deferred, int8_t* status,
                     StatusCounts& counts) {
  for (const int64_t j : deferred) {
    const Status s =
        tile_upsert_spill(SerialTile{}, t, order ? order[j] : j, j, keys[j], args, sink);
    status[j] = static_cast<int8_t>(s);
    ++counts.by_status[static_cast<int>(s)];
  }
  P::store_fence();
}

/// Sinks whose per-key outputs go to position o (SlotSink's slots): partitioned
/// batches give them a buffer in partition order and restore batch order after.
template <class Sink>
concept SlotOutputs = requires(Sink s) { s.slots; };

/// Runs a mutating batch partitioned by home-bucket range (see executor_cpu.h) on
/// `threads` threads. Thread c calls work(c, order, part_keys, begin, end): partition
/// positions [begin, end) hold its keys, order[j] being the batch index at position j
/// and part_keys[j] = keys[order[j]]; it writes per-key outputs at positions. After a
/// barrier, one thread calls finish(order, part_keys); after another, each thread
/// calls restore(lo, hi, position) for an even range [lo, hi) of
/// batch indices, position[i] being the partition position of batch index i, to move
/// outputs to batch order: writing at batch positions directly would make the threads
/// store into the same cache lines, key after key.
///
/// Bucket locks: the Python owner runs one mutating batch at a time and no reader
/// beside it (dynemb/table/rw_lock.py), so only the threads of this batch compete.
/// Pass 1 of the batch rule touches home buckets only, and each thread owns a range
/// of home buckets; pass 2 runs on one thread: no lock is ever needed.
template <class V, class Work, class Finish, class Restore>
void run_partitioned(const TableRef<V>& t, const int64_t* keys, const int64_t* chosen, int64_t n,
                     int threads, Work&& work, Finish&& finish, Restore&& restore) {
  // Uninitialised (each entry is written once below), not zero-filled first.
  const std::unique_ptr<int64_t[]> order(new int64_t[n]);  // batch index of position j
  const std::unique_ptr<int64_t[]> position(new int64_t[n]);  // its inverse
  // keys[order[j]]: each part reads its keys in sequence, not scattered over the batch.
  const std::unique_ptr<int64_t[]> keys_by_position(new int64_t[n]);
  const std::unique_ptr<uint16_t[]> part(new uint16_t[n]);  // part of batch index i
  // count[c * T + p]: keys of chunk c in part p, then the first position of those.
  std::vector<int64_t> count(static_cast<size_t>(threads) * threads, 0);
  std::vector<int64_t> part_begin(threads + 1, 0);
#pragma omp parallel num_threads(threads)
  {
    const int T = omp_get_num_threads();
    const int c = omp_get_thread_num();
    const int64_t lo = n * c / T, hi = n * (c + 1) / T;
    std::vector<int64_t> mine(T, 0);  // this chunk's counts, then cursors (not shared)
    for (int64_t i = lo; i < hi; ++i) {
      const int64_t b =
          chosen ? Choice::bucket(t, chosen[i]) : bucket_of(hash_key(keys[i]), t.num_buckets);
      const int64_t p = b * T / t.num_buckets;
      part[i] = static_cast<uint16_t>(p);
      ++mine[p];
    }
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
      const int64_t j = mine[part[i]]++;
      order[j] = i;
      position[i] = j;
      keys_by_position[j] = keys[i];
    }
#pragma omp barrier
    work(c, order.get(), keys_by_position.get(), part_begin[c], part_begin[c + 1]);
#pragma omp barrier
#pragma omp single
    finish(order.get(), keys_by_position.get());
    restore(lo, hi, position.get());
  }
}

/// Pass 0 of the batch rule (core/table_ops.h chooses_buckets): tile_choose_bucket of each
/// key, by batch index, as a Choice; it only reads the table.
template <class V>
std::vector<int64_t> choose_buckets(const TableRef<V>& t, const int64_t* keys, int64_t n) {
  std::vector<int64_t> chosen(n);
  // The loop prefetches home lines; a new key also counts the free slots of its home,
  // and of its second bucket when the home is filled to 13/16 (home_takes_new_keys):
  // their digest lines are fetched this far ahead (a miss in the home line itself may
  // stop there: bucket.h "Holes"), the second's only for a flagged home: a home is
  // flagged once a key of it went to its second, which a new key does only from a home
  // filled to 13/16 (a rehash, from one filled to 7/8). Past a miss in a flagged home
  // it also looks for the key there, reading the key of each digest match: the first
  // match's key line is fetched kReadGroup keys ahead, once the digests are in.
  constexpr int64_t kSecondAhead = 2 * kReadGroup;
  at::parallel_for(0, n, kGrain, [&](int64_t begin, int64_t end) {
    auto key_at = [&](int64_t i) { return keys[i]; };
    auto body = [&](int64_t i, int64_t hint, const KeyProbe& p) {
      if (i + kSecondAhead < end) {
        const uint64_t h = hash_key(keys[i + kSecondAhead]);
        const int64_t home = bucket_of(h, t.num_buckets);
        P::prefetch_lines(t.digests + home * t.bucket_capacity, t.bucket_capacity);
        if (t.overflowed(home)) {
          const int64_t second = second_bucket_of(h, t.num_buckets);
          P::prefetch_lines(t.digests + second * t.bucket_capacity, t.bucket_capacity);
        }
      }
      if (i + kReadGroup < end) {
        const uint64_t h = hash_key(keys[i + kReadGroup]);
        const int64_t home = bucket_of(h, t.num_buckets);
        if (t.overflowed(home)) {
          const int64_t b = second_bucket_of(h, t.num_buckets);
          const ProbeOrder order(h, t.bucket_capacity);
          const uint8_t digest = digest_of(h);
          const int64_t s = likely_slot<P>(t, b, digest, order, order.span);
          if (s >= 0 && t.digest(s) == digest) P::prefetch(t.keys + s);
        }
      }
      int64_t stored;
      const int64_t bucket = tile_choose_bucket(SerialTile{}, t, keys[i], p, &stored, hint);
      chosen[i] = stored >= 0 ? Choice::of_stored(stored) : bucket;
    };
    prefetched_loop<Touches::kRead, RowUse::kNone, kReadGroup>(t, begin, end, key_at, body);
  });
  return chosen;
}

/// Upserts a batch by the batch rule: pass 0 where it runs, pass 1 partitioned by the
/// range of each key's bucket (run_partitioned), pass 2 on one thread.
template <class V, class Sink>
StatusCounts upsert_batch(const TableRef<V>& t, const Sink& sink, const UpsertArgs& args,
                         const int64_t* keys, int64_t n, int8_t* status) {
  const int max_threads = threads_for(n);
  StatusCounts total;
  std::vector<int64_t> chosen_buckets;
  if (chooses_buckets(t, args)) chosen_buckets = choose_buckets(t, keys, n);
  const int64_t* chosen = chosen_buckets.empty() ? nullptr : chosen_buckets.data();
  if (max_threads == 1) {
    std::vector<int64_t> deferred;
    upsert_sequence(t, sink, args, keys, nullptr, 0, n, status, total, deferred, chosen);
    upsert_deferred(t, sink, args, keys, nullptr, deferred, status, total);
    return total;
  }
  std::vector<int8_t> status_by_position(n);
  Sink by_position = sink;
  std::vector<int64_t> slots_by_position;
  if constexpr (SlotOutputs<Sink>) {
    slots_by_position.resize(n);
    by_position.slots = slots_by_position.data();
  }
  std::vector<StatusCounts> counts(max_threads + 1);
  std::vector<std::vector<int64_t>> deferred(max_threads);
  auto work = [&](int c, const int64_t* order, const int64_t* part_keys, int64_t begin,
                  int64_t end) {
    upsert_sequence(t, by_position, args, part_keys, order, begin, end,
                    status_by_position.data(), counts[c], deferred[c], chosen);
  };
  auto finish = [&](const int64_t* order, const int64_t* part_keys) {
    // Rare (NO_EVICTION spills): positions merged into batch order.
    const std::vector<int64_t> all = merged_in_order(
        deferred, [&](int64_t a, int64_t b) { return order[a] < order[b]; });
    if (all.empty()) return;
    upsert_deferred(t, by_position, args, part_keys, order, all, status_by_position.data(),
                    counts[max_threads]);
  };
  auto restore = [&](int64_t lo, int64_t hi, const int64_t* position) {
    for (int64_t i = lo; i < hi; ++i) {
      status[i] = status_by_position[position[i]];
      if constexpr (SlotOutputs<Sink>) sink.slots[i] = slots_by_position[position[i]];
    }
  };
  run_partitioned(t, keys, chosen, n, max_threads, work, finish, restore);
  for (const StatusCounts& c : counts) {
    for (int s = 0; s < kStatusCount; ++s) total.by_status[s] += c.by_status[s];
  }
  return total;
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
  if constexpr (std::is_same_v<Sink, AssignSink<typename decltype(sink.t)::Value>>) {
    using V = typename decltype(sink.t)::Value;
    const AssignSink<V, StreamingStore> streaming{sink.t,  sink.init,     sink.dim,
                                                  sink.in, sink.in_width, sink.evicted};
    if (streams_output(n * sink.in_width * static_cast<int64_t>(sizeof(V))) &&
        assigned_rows_streamed(streaming)) {
      return upsert_batch(sink.t, streaming, args, keys, n, status);
    }
  }
  return upsert_batch(sink.t, sink, args, keys, n, status);
}

void scores_after_hit(const ScoreArgs& args, const uint64_t* scores, int64_t n, uint64_t* out) {
  at::parallel_for(0, n, kGrain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) out[i] = score_after_tier_hit(args, i, scores[i]);
  });
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

/// The prefetched loop of a find by key: the one that also fetches a flagged home's
/// second bucket (kSeconds) where keys may sit there (a NO_EVICTION table, which keeps
/// no scores, of two buckets or more), else the plain one.
template <RowUse kRows, class V, class KeyAt, class Body>
void find_loop(const TableRef<V>& t, int64_t begin, int64_t end, KeyAt&& key_at, Body&& body) {
  if (t.scores == nullptr && t.num_buckets > 1) {
    prefetched_loop<Touches::kRead, kRows, kReadGroup, true, true>(t, begin, end, key_at, body);
  } else {
    prefetched_loop<Touches::kRead, kRows, kReadGroup>(t, begin, end, key_at, body);
  }
}

/// find, writing found rows with Store (PlainStore or StreamingStore).
template <class Store, class V>
void find_rows(const TableRef<V>& t, const int64_t* keys, int64_t n, V* out, int64_t out_width,
               bool* found) {
  at::parallel_for(0, n, kGrain, [&](int64_t begin, int64_t end) {
    auto key_at = [&](int64_t j) { return keys[j]; };
    auto body = [&](int64_t i, int64_t hint) {
      const int64_t slot = find_slot_hinted(t, keys[i], hint);
      found[i] = slot >= 0;
      V* dst = out + i * out_width;
      if (slot >= 0) {
        Store::row(t.row(slot), dst, out_width);
      } else {
        for (int64_t j = 0; j < out_width; ++j) dst[j] = V(0);
      }
    };
    find_loop<RowUse::kAll>(t, begin, end, key_at, body);
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
    auto body = [&](int64_t i, int64_t hint) { slots[i] = find_slot_hinted(t, keys[i], hint); };
    find_loop<RowUse::kNone>(t, begin, end, key_at, body);
  });
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
                                    int64_t, int8_t*);

DYNEMB_INSTANTIATE(float)
DYNEMB_INSTANTIATE(c10::Half)
DYNEMB_INSTANTIATE(c10::BFloat16)

}  // namespace dynemb::cpu
