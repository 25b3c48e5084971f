// ThreadSanitizer driver for the table algorithm (`make sanitize-tsan`).
//
// TSan cannot run inside Python + torch (uninstrumented OpenMP and allocator), so this
// torch-free program runs csrc/core's algorithm concurrently the way the executors do,
// and checks the outcome against what each thread stored:
//   cpu        CpuPlatform (the CPU executor's platform) from std::threads: upserts and
//              erases of one bucket racing under the bucket locks; pass 1 partitioned by
//              home-bucket range with no locks (CpuExclusivePlatform, as executor_cpu.cpp
//              runs it); lock-free finds after a barrier; one dedup set filled by all.
//   emulated   the csrc/cuda launchers built for the host (csrc/emulated), whose grids run
//              on a pool of OS threads: upsert / find / erase / rehash / dedup from several
//              host threads under a reader-writer lock (dynemb/table/rw_lock.py's rule);
//              and, each host thread on tables of its own (writers of different tables
//              run together) or as readers under the shared lock:
//                upsert_grouped  launch_upsert_grouped, 3 parts a call (an evicting table
//                                given ~2x more distinct keys than it holds, and repeats:
//                                in-batch eviction under pins; an empty part; a NO_EVICTION
//                                table that spills): every status, slot, pin, row and count
//                                as the table before the batch implies.
//                pool            launch_pool, SUM and MEAN with per-sample weights, 2 parts
//                                (slots per index / per distinct key, dense / feature-major
//                                output, absent keys, empty bags) beside a writer: every bag
//                                equals the sum computed on the host.
//                backward        launch_backward, 2 parts (a hot key of ~2,300 indices, a
//                                key of 2 gradient chunks, a skipped key, an empty bag),
//                                SGD and EXACT_ROWWISE_ADAGRAD, SUM and MEAN: every row and
//                                its state, bit for bit, as computed on the host (SGD + SUM
//                                exactly, in any order).
// Arguments: the names of the cases to run (all when none).
// Exit status 0 when every check holds; TSan itself exits 66 on a report (halt_on_error).
#define DYNEMB_CUDA_EMULATION 1  // the csrc/cuda launchers, host build (cuda/runtime.cuh)

#include <algorithm>
#include <barrier>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/dedup.h"
#include "cpu/cpu_platform.h"
#include "cuda/launchers_cuda.h"

namespace {

using namespace dynemb;

constexpr int kThreads = 4;
constexpr int64_t kDim = 4;

#define CHECK(cond, ...)                                                     \
  do {                                                                       \
    if (!(cond)) {                                                           \
      std::fprintf(stderr, "tsan_tables: %s:%d: ", __FILE__, __LINE__);      \
      std::fprintf(stderr, __VA_ARGS__);                                     \
      std::fprintf(stderr, "\n");                                            \
      std::exit(1);                                                          \
    }                                                                        \
  } while (0)

/// The row a test writes for `key` (AssignSink input).
float row_value(int64_t key, int64_t j) { return static_cast<float>((key * 7 + j) % 1000); }

/// Owns a table's buffers (NO_EVICTION when !evicting: no scores); rows of `width`
/// columns (an embedding of dim <= width, then optimizer state).
struct Table {
  int64_t buckets, capacity, width;
  std::vector<uint8_t> digests, overflow;
  std::vector<int64_t> keys;
  std::vector<uint64_t> scores;
  std::vector<float> values;
  std::vector<uint32_t> locks;
  std::vector<uint32_t> pins;

  Table(int64_t b, int64_t c, bool evicting, int64_t w = kDim)
      : buckets(b), capacity(c), width(w), digests(b * c), overflow(b), keys(b * c),
        scores(evicting ? b * c : 0), values(b * c * w), locks(b), pins(evicting ? b * c : 0) {}

  TableRef<float> ref() {
    return TableRef<float>{digests.data(),  keys.data(),    scores.empty() ? nullptr : scores.data(),
                           nullptr,         values.data(),  nullptr,
                           locks.data(),    overflow.data(), pins.empty() ? nullptr : pins.data(),
                           buckets,         capacity,       width,
                           buckets * capacity};
  }

  /// key -> slot of every stored key (each at most once: checked).
  std::map<int64_t, int64_t> stored() const {
    std::map<int64_t, int64_t> slot_of;
    for (int64_t s = 0; s < buckets * capacity; ++s) {
      if (digests[s] == kEmptyDigest) continue;
      CHECK(slot_of.emplace(keys[s], s).second, "key %lld stored twice",
            static_cast<long long>(keys[s]));
    }
    return slot_of;
  }
};

UpsertArgs args_for(ScoreStrategy s, uint64_t batch) {
  // Each batch pins its own keys (pin numbers = batch numbers, as a table's owner does).
  return UpsertArgs{ScoreArgs{s, batch, nullptr, nullptr}, kEvictAny,
                    static_cast<uint32_t>(batch), static_cast<uint32_t>(batch)};
}

InitArgs uniform_init() { return InitArgs{InitMode::kUniform, -1.0f, 1.0f, 0, 0, 0, 42}; }

void run_threads(int n, const std::function<void(int)>& body) {
  std::vector<std::thread> threads;
  for (int t = 0; t < n; ++t) threads.emplace_back(body, t);
  for (auto& th : threads) th.join();
}

// ---------------------------------------------------------------- CPU executor
/// Threads upsert (AssignSink) and erase keys of shared buckets under the bucket locks,
/// then all read every key without locks; each key's presence and row must match.
void cpu_locked_upsert_erase_find() {
  Table table(64, 128, false);  // 8192 slots, ~4000 keys: some spill (upsert_spill)
  const TableRef<float> t = table.ref();
  constexpr int64_t kKeys = 6000;
  std::barrier sync(kThreads);
  run_threads(kThreads, [&](int me) {
    for (int round = 0; round < 3; ++round) {
      std::vector<int64_t> mine;
      for (int64_t k = me; k < kKeys; k += kThreads) mine.push_back(k * 1000003 + round);
      std::vector<float> rows(mine.size() * kDim);
      for (size_t i = 0; i < mine.size(); ++i)
        for (int64_t j = 0; j < kDim; ++j) rows[i * kDim + j] = row_value(mine[i], j);
      AssignSink<float> sink{t, uniform_init(), kDim, rows.data(), kDim, {}};
      const UpsertArgs u = args_for(ScoreStrategy::kNoEviction, round);
      for (size_t i = 0; i < mine.size(); ++i) {
        Status s;
        const auto ii = static_cast<int64_t>(i);
        if (!upsert_home<CpuPlatform>(t, ii, ii, mine[i], u, sink, &s))
          s = upsert_spill<CpuPlatform>(t, ii, ii, mine[i], u, sink);
        CHECK(s != Status::kFailed, "key %lld not stored", static_cast<long long>(mine[i]));
      }
      for (size_t i = 0; i < mine.size(); i += 3) {
        CHECK(erase_key<CpuPlatform>(t, mine[i]), "erase of a stored key reported absent");
      }
      sync.arrive_and_wait();  // readers never run beside writers (platform.h)
      for (int64_t k = 0; k < kKeys; ++k) {
        const int64_t key = k * 1000003 + round;
        const int64_t slot = find_slot<CpuPlatform>(t, key);
        const bool erased = (k / kThreads) % 3 == 0;
        CHECK((slot >= 0) == !erased, "key %lld: found %d, erased %d", static_cast<long long>(key),
              slot >= 0, erased);
        if (slot >= 0) CHECK(t.row(slot)[1] == row_value(key, 1), "key %lld: wrong row",
                             static_cast<long long>(key));
      }
      sync.arrive_and_wait();
      for (size_t i = 0; i < mine.size(); ++i) erase_key<CpuPlatform>(t, mine[i]);
      sync.arrive_and_wait();
    }
  });
}

/// Pass 1 partitioned by home-bucket range without locks (executor_cpu.cpp), on an evicting
/// table that overflows; then every stored key appears once with its initial row.
void cpu_partitioned_evicting() {
  Table table(32, 16, true);  // 512 slots for 4096 keys: evictions in every bucket
  const TableRef<float> t = table.ref();
  constexpr int64_t kKeys = 4096;
  std::vector<int64_t> keys(kKeys);
  for (int64_t i = 0; i < kKeys; ++i) keys[i] = (i * 2654435761LL) ^ (i << 40);
  std::vector<float> out(kKeys * kDim);
  std::vector<int64_t> evicted(kKeys, -1);
  FindOrInsertSink<float> sink{t, uniform_init(), kDim, out.data(), kDim,
                               EvictedOut<float>{evicted.data(), nullptr, nullptr}};
  for (uint64_t batch = 1; batch <= 4; ++batch) {
    const UpsertArgs u = args_for(ScoreStrategy::kStep, batch);
    run_threads(kThreads, [&](int me) {
      for (int64_t i = 0; i < kKeys; ++i) {
        const int64_t home = bucket_of(hash_key(keys[i]), t.num_buckets);
        if (home * kThreads / t.num_buckets != me) continue;
        Status s;
        CHECK(upsert_home<CpuExclusivePlatform>(t, i, i, keys[i], u, sink, &s),
              "an evicting upsert left its home bucket");
      }
    });
  }
  std::map<int64_t, int> seen;
  std::vector<float> own(kDim);
  for (int64_t s = 0; s < t.num_slots(); ++s) {
    if (t.digests[s] == kEmptyDigest) continue;
    CHECK(++seen[t.keys[s]] == 1, "key %lld stored twice", static_cast<long long>(t.keys[s]));
    init_row(uniform_init(), t.keys[s], own.data(), kDim, kDim);
    CHECK(std::equal(own.begin(), own.end(), t.row(s)), "slot %lld: not its key's row",
          static_cast<long long>(s));
  }
  CHECK(static_cast<int64_t>(seen.size()) == t.num_slots(), "a full table has free slots");
}

/// All threads fill one dedup set (core/dedup.h) with overlapping keys: one cell per key.
void cpu_dedup_shared_set() {
  constexpr int64_t kKeys = 1 << 14;
  const int64_t capacity = dedup_capacity(kKeys);
  std::vector<int64_t> cell_keys(capacity);
  std::vector<int32_t> states(capacity, kEmptyCell);
  const DedupSetRef set{cell_keys.data(), states.data(), capacity};
  std::vector<int64_t> cell_of(kKeys * kThreads);
  run_threads(kThreads, [&](int me) {
    for (int64_t i = 0; i < kKeys; ++i) {
      bool is_new = false;
      const int64_t k = (i * 31 + me * 7) % kKeys;  // every thread meets every key
      cell_of[me * kKeys + k] = dedup_cell<CpuPlatform>(set, k * 977, &is_new);
    }
  });
  for (int64_t k = 0; k < kKeys; ++k) {
    for (int me = 1; me < kThreads; ++me)
      CHECK(cell_of[me * kKeys + k] == cell_of[k], "key %lld got two cells",
            static_cast<long long>(k));
    CHECK(cell_keys[cell_of[k]] == k * 977, "cell of key %lld holds another key",
          static_cast<long long>(k));
  }
}

// ---------------------------------------------------------------- emulated CUDA executor
namespace emu = dynemb::cuda_emulated;

/// Workspace over malloc, freed with the object (launches are synchronous in emulation).
class HeapWorkspace : public emu::Workspace {
 public:
  ~HeapWorkspace() override {
    for (void* p : blocks_) std::free(p);
  }
  void* bytes(int64_t n) override {
    blocks_.push_back(std::aligned_alloc(64, static_cast<size_t>((n + 63) / 64 * 64 + 64)));
    return blocks_.back();
  }

 private:
  std::vector<void*> blocks_;
};

/// Host threads, each with its own keys, upsert / erase (exclusive lock) and find (shared
/// lock) on one table; a last writer grows it by rehash. Kernels race inside each launch.
void emulated_upsert_find_erase_rehash() {
  Table table(64, 128, false);
  Table grown(128, 128, false);
  std::shared_mutex rw;
  constexpr int64_t kPerThread = 1500;
  run_threads(kThreads, [&](int me) {
    std::vector<int64_t> keys(kPerThread);
    for (int64_t i = 0; i < kPerThread; ++i) keys[i] = (i * kThreads + me) * 998244353LL;
    std::vector<float> rows(kPerThread * kDim), found_rows(kPerThread * kDim);
    for (int64_t i = 0; i < kPerThread; ++i)
      for (int64_t j = 0; j < kDim; ++j) rows[i * kDim + j] = row_value(keys[i], j);
    std::vector<int8_t> status(kPerThread);
    std::vector<int64_t> counts(kStatusCount);
    std::unique_ptr<bool[]> flags(new bool[kPerThread]);
    for (int round = 0; round < 3; ++round) {
      {
        std::unique_lock<std::shared_mutex> w(rw);
        HeapWorkspace ws;
        AssignSink<float> sink{table.ref(), uniform_init(), kDim, rows.data(), kDim, {}};
        emu::launch_upsert_keys(sink, args_for(ScoreStrategy::kNoEviction, round), keys.data(),
                                kPerThread, status.data(), counts.data(), ws, nullptr);
        CHECK(counts[static_cast<int>(Status::kFailed)] == 0, "emulated upsert failed keys");
        emu::launch_erase(table.ref(), keys.data(), kPerThread / 2, flags.get(), ws, nullptr);
      }
      std::shared_lock<std::shared_mutex> r(rw);
      emu::launch_find(table.ref(), keys.data(), kPerThread, found_rows.data(), kDim, flags.get(),
                       nullptr);
      for (int64_t i = 0; i < kPerThread; ++i) {
        CHECK(flags[i] == (i >= kPerThread / 2), "emulated find: key %lld presence",
              static_cast<long long>(keys[i]));
        if (flags[i]) CHECK(found_rows[i * kDim + 2] == row_value(keys[i], 2), "emulated row");
      }
    }
  });
  HeapWorkspace ws;
  int64_t failed = -1;
  emu::launch_rehash(table.ref(), grown.ref(), kMaxProbeBuckets, &failed, ws, nullptr);
  CHECK(failed == 0, "rehash lost %lld keys", static_cast<long long>(failed));
  int64_t stored = 0;
  for (uint8_t d : grown.digests) stored += d != kEmptyDigest;
  CHECK(stored == kThreads * (kPerThread - kPerThread / 2), "rehash moved %lld keys",
        static_cast<long long>(stored));
}

/// Two large batches with many repeats through one launch_dedup (a grouped call of two
/// parts, as unique_keys_grouped makes it): each part's uids in its own first-occurrence
/// order, at its own range of the outputs.
void emulated_dedup() {
  constexpr int64_t n = 1 << 16;
  std::vector<int64_t> keys(n), unique(n), inverse(n), counts(n);
  for (int64_t i = 0; i < n; ++i) keys[i] = ((i * 7919) % 4099) * 1000000007LL;
  DedupPart halves[2] = {{keys.data(), n / 2, 0, 0}, {keys.data() + n / 2, n - n / 2, 0, 0}};
  const PartTotals totals = number_parts(halves, 2);
  int64_t num_unique[2] = {0, 0};
  HeapWorkspace ws;
  emu::launch_dedup(Parts<DedupPart>{halves, {}, 2}, totals, unique.data(), inverse.data(),
                    counts.data(), num_unique, ws, nullptr);
  for (int p = 0; p < 2; ++p) {
    const int64_t begin = halves[p].index_begin, end = begin + halves[p].n;
    std::map<int64_t, int64_t> first;
    for (int64_t i = begin; i < end; ++i) {
      first.emplace(keys[i], static_cast<int64_t>(first.size()));
    }
    CHECK(num_unique[p] == static_cast<int64_t>(first.size()), "dedup: part %d: %lld unique keys",
          p, static_cast<long long>(num_unique[p]));
    for (int64_t i = begin; i < end; ++i) {
      CHECK(inverse[i] == first[keys[i]], "dedup: inverse[%lld]", static_cast<long long>(i));
      CHECK(unique[begin + inverse[i]] == keys[i], "dedup: unique");
    }
  }
}


/// Key `id` of host thread `me` (each thread's keys are its own).
int64_t key_of(int me, int64_t id) { return (static_cast<int64_t>(me + 1) << 40) + id * 1000003; }

/// The status a pinned batch upsert gives each position of `keys` on `t` (one part of a
/// grouped lookup), from the table as it stands before the batch (`before`: key -> slot).
/// Evicting tables (keys in their home bucket): the batch's stored keys are pinned
/// first, then its new keys of each bucket, in batch order, take its free slots
/// (inserted), then its unpinned residents' (evicted), then fail. NO_EVICTION tables
/// with room: new keys are inserted. A repeated key is a hit, or fails again.
std::vector<Status> expected_status(const Table& t, bool evicting, const std::vector<int64_t>& keys,
                                    const std::map<int64_t, int64_t>& before) {
  std::vector<int64_t> residents(t.buckets, 0), hits(t.buckets, 0), placed(t.buckets, 0);
  for (const auto& [key, slot] : before) ++residents[slot / t.capacity];
  std::map<int64_t, Status> first;
  for (int64_t key : keys) {
    if (before.count(key) && first.emplace(key, Status::kHit).second)
      ++hits[bucket_of(hash_key(key), t.buckets)];
  }
  std::vector<Status> status;
  for (int64_t key : keys) {
    auto it = first.find(key);
    if (it != first.end()) {
      status.push_back(it->second == Status::kFailed ? Status::kFailed : Status::kHit);
      continue;
    }
    Status s = Status::kInserted;
    if (evicting) {
      const int64_t b = bucket_of(hash_key(key), t.buckets);
      const int64_t rank = placed[b]++;
      s = rank < t.capacity - residents[b]    ? Status::kInserted
          : rank < t.capacity - hits[b]       ? Status::kEvicted
                                              : Status::kFailed;
    }
    first.emplace(key, s);
    status.push_back(s);
  }
  return status;
}

/// Each host thread runs pinned training lookups (launch_upsert_grouped: SlotSink,
/// init_rows) of 3 batches on its own three tables in one call per batch (writers of
/// different tables run together): part 0 an evicting (STEP) table of 64 slots given
/// 120 distinct keys and 60 repeats a batch, half of them its last batch's (in-batch
/// eviction: what does not fit fails, no key evicts its own batch's), part 1 no keys,
/// part 2 a NO_EVICTION table whose home bucket 3 gets more keys than it holds (pass 2
/// spills them). Each position's status and slot are what the table before the batch
/// implies; a slot holds its key, the batch's pin, and the key's initial row; the
/// counts are the statuses'.
void emulated_upsert_grouped() {
  run_threads(kThreads, [&](int me) {
    Table small(4, 16, true), none(2, 16, true), spill(16, 16, false);
    std::vector<int64_t> hot, cold;  // part 2's keys homed in bucket 3, and elsewhere
    for (int64_t id = 1'000'000; hot.size() < 18 || cold.size() < 60; ++id) {
      const int64_t key = key_of(me, id);
      (bucket_of(hash_key(key), spill.buckets) == 3 ? hot : cold).push_back(key);
    }
    std::vector<int64_t> spilled_keys;
    for (uint32_t batch = 1; batch <= 3; ++batch) {
      std::vector<int64_t> keys[3];
      const int64_t first = batch * 60;
      for (int64_t i = 0; i < 120; ++i) keys[0].push_back(key_of(me, first + (i * 7) % 120));
      for (int64_t i = 0; i < 60; ++i) keys[0].push_back(key_of(me, first + (i * 13 + 5) % 120));
      for (int64_t i = 0; i < 6; ++i) keys[2].push_back(hot[(batch - 1) * 6 + i]);
      for (int64_t i = 0; i < 20; ++i) keys[2].push_back(cold[(batch - 1) * 20 + i]);
      for (int64_t i = 0; i < 10; ++i) keys[2].push_back(keys[2][(i * 3) % 26]);
      for (int64_t i = 0; batch > 1 && i < 10; ++i) keys[2].push_back(cold[(batch - 2) * 20 + i]);
      Table* tables[3] = {&small, &none, &spill};
      std::map<int64_t, int64_t> before[3];
      std::vector<Status> expected[3];
      for (int p = 0; p < 3; ++p) {
        before[p] = tables[p]->stored();
        expected[p] = expected_status(*tables[p], p != 2, keys[p], before[p]);
      }
      std::vector<int64_t> slots[3];
      std::vector<int64_t> counts(3 * kStatusCount, 0);
      UpsertPart<float> parts[3];
      for (int p = 0; p < 3; ++p) {
        slots[p].assign(keys[p].size(), -2);
        const auto n = static_cast<int64_t>(keys[p].size());
        const SlotSink<float> sink{tables[p]->ref(), uniform_init(), kDim, slots[p].data(),
                                   EvictedOut<float>{nullptr, nullptr, nullptr}, true};
        const ScoreStrategy s = p == 2 ? ScoreStrategy::kNoEviction : ScoreStrategy::kStep;
        parts[p] = UpsertPart<float>{sink,    args_for(s, batch), keys[p].data(), nullptr,
                                     counts.data() + p * kStatusCount, n, 0, 0, 0};
      }
      const PartTotals totals = number_parts(parts, 3);
      std::vector<int8_t> status(totals.indices, -1);
      for (UpsertPart<float>& q : parts) q.status = status.data() + q.key_begin;
      HeapWorkspace ws;
      emu::launch_upsert_grouped(Parts<UpsertPart<float>>{parts, {}, 3}, totals, status.data(),
                                 ws, nullptr);
      std::vector<float> own(kDim);
      for (int p = 0; p < 3; ++p) {
        const Table& t = *tables[p];
        int64_t tally[kStatusCount] = {0, 0, 0, 0};
        std::map<int64_t, int64_t> slot_of;
        for (size_t i = 0; i < keys[p].size(); ++i) {
          const int64_t key = keys[p][i], slot = slots[p][i];
          const int8_t s = parts[p].status[i];
          CHECK(s == static_cast<int8_t>(expected[p][i]),
                "grouped upsert: part %d, batch %u, position %zu: status %d, expected %d", p,
                batch, i, s, static_cast<int>(expected[p][i]));
          ++tally[s];
          CHECK((slot >= 0) == (s != static_cast<int8_t>(Status::kFailed)),
                "grouped upsert: part %d: slot %lld for status %d", p,
                static_cast<long long>(slot), s);
          CHECK(slot_of.emplace(key, slot).first->second == slot,
                "grouped upsert: part %d: a repeated key got two slots", p);
          if (slot < 0) continue;
          CHECK(t.keys[slot] == key && t.digests[slot] != kEmptyDigest,
                "grouped upsert: part %d: slot %lld does not hold its key", p,
                static_cast<long long>(slot));
          if (!t.pins.empty()) CHECK(t.pins[slot] == batch, "grouped upsert: a slot's pin");
          init_row(uniform_init(), key, own.data(), kDim, kDim);
          CHECK(std::equal(own.begin(), own.end(), &t.values[slot * t.width]),
                "grouped upsert: part %d: key %lld: not its initial row", p,
                static_cast<long long>(key));
          if (p == 2 && slot / t.capacity != bucket_of(hash_key(key), t.buckets))
            spilled_keys.push_back(key);
        }
        for (int s = 0; s < kStatusCount; ++s)
          CHECK(counts[p * kStatusCount + s] == tally[s],
                "grouped upsert: part %d: %lld keys counted with status %d, %lld seen", p,
                static_cast<long long>(counts[p * kStatusCount + s]), s,
                static_cast<long long>(tally[s]));
        const std::map<int64_t, int64_t> after = t.stored();  // no key stored twice
        if (p == 2) {  // NO_EVICTION keeps every key it stored
          for (const auto& [key, slot] : before[p])
            CHECK(after.count(key) && after.at(key) == slot, "grouped upsert: a key moved");
        }
      }
      CHECK(counts[static_cast<int>(Status::kEvicted)] > 0 || batch == 1,
            "grouped upsert: no eviction in batch %u", batch);
      CHECK(counts[static_cast<int>(Status::kFailed)] > 0, "grouped upsert: no in-batch failure");
    }
    CHECK(!spilled_keys.empty(), "grouped upsert: no key spilled (pass 2 not run)");
  });
}

/// The missing-row initializer of the pooling and its rows (core/pooling.h).
InitArgs missing_init() { return InitArgs{InitMode::kUniform, -0.5f, 0.5f, 0, 0, 0, 7}; }

/// Readers pool under the shared lock while a writer re-assigns rows under the exclusive
/// one (rw_lock.py's rule): every host thread pools its own bags of two tables in one
/// launch_pool per round, SUM and MEAN, with per-sample weights, empty bags and keys that
/// are not stored (the `missing` initializer's row). Part 0 reads a slot per index into
/// a dense (bags, 4) output; part 1 (dim 8, rows of 9 columns) reads slots per distinct
/// key through `inverse` into the columns of a feature-major (32, 16) output. Each
/// pooled bag equals the sum computed here from the rows the keys were given.
void emulated_pool() {
  Table narrow(16, 32, false), wide(16, 32, false, 9);
  constexpr int64_t kStored = 300;
  const int64_t dims[2] = {kDim, 8};
  Table* tables[2] = {&narrow, &wide};
  std::vector<int64_t> stored_keys(kStored);
  for (int64_t i = 0; i < kStored; ++i) stored_keys[i] = i * 998244353LL + 11;
  std::shared_mutex rw;
  auto assign_rows = [&] {  // AssignSink: every stored key's row is row_value(key, j)
    for (int p = 0; p < 2; ++p) {
      std::vector<float> rows(kStored * dims[p]);
      for (int64_t i = 0; i < kStored; ++i)
        for (int64_t j = 0; j < dims[p]; ++j) rows[i * dims[p] + j] = row_value(stored_keys[i], j);
      std::vector<int8_t> status(kStored);
      std::vector<int64_t> counts(kStatusCount);
      HeapWorkspace ws;
      AssignSink<float> sink{tables[p]->ref(), uniform_init(), dims[p], rows.data(), dims[p], {}};
      emu::launch_upsert_keys(sink, args_for(ScoreStrategy::kNoEviction, 0), stored_keys.data(),
                              kStored, status.data(), counts.data(), ws, nullptr);
      CHECK(counts[static_cast<int>(Status::kFailed)] == 0, "pool: a row not stored");
    }
  };
  assign_rows();
  run_threads(kThreads, [&](int me) {
    for (int round = 0; round < 2; ++round) {
      if (me == 0 && round == 1) {  // a writer between the readers (hits: same slots)
        std::unique_lock<std::shared_mutex> w(rw);
        assign_rows();
      }
      const PoolingMode mode = round % 2 == 0 ? PoolingMode::kSum : PoolingMode::kMean;
      // Bags of 0 .. 6 indices; one key in 5 is not stored (a negative key).
      std::vector<int64_t> keys[2], offsets[2];
      std::vector<float> weights[2];
      const int64_t num_bags[2] = {96, 64};  // part 1: 2 features of 32 bags
      for (int p = 0; p < 2; ++p) {
        offsets[p].push_back(0);
        for (int64_t b = 0; b < num_bags[p]; ++b) {
          const int64_t len = (b * 5 + me + round) % 7;
          for (int64_t k = 0; k < len; ++k) {
            const int64_t x = (b * 31 + k * 17 + me * 13 + round * 7) % (kStored + kStored / 4);
            keys[p].push_back(x < kStored ? stored_keys[x] : -(x * 1000 + 3));  // < 0: absent
            weights[p].push_back(0.25f * static_cast<float>((x + k) % 9) - 0.75f);
          }
          offsets[p].push_back(static_cast<int64_t>(keys[p].size()));
        }
      }
      // Part 1's distinct keys and the id of each index.
      std::vector<int64_t> unique, inverse;
      std::map<int64_t, int64_t> id;
      for (int64_t key : keys[1]) {
        const auto [it, fresh] = id.emplace(key, static_cast<int64_t>(unique.size()));
        if (fresh) unique.push_back(key);
        inverse.push_back(it->second);
      }
      std::vector<float> dense(num_bags[0] * kDim, -1.0f), columns_out(32 * 16, -1.0f);
      const int64_t columns[2] = {0, 8};
      std::shared_lock<std::shared_mutex> r(rw);
      std::vector<int64_t> slots0(keys[0].size()), slots1(unique.size());
      emu::launch_find_slots(narrow.ref(), keys[0].data(), static_cast<int64_t>(keys[0].size()),
                             slots0.data(), nullptr);
      emu::launch_find_slots(wide.ref(), unique.data(), static_cast<int64_t>(unique.size()),
                             slots1.data(), nullptr);
      PoolPart<float> parts[2] = {
          {narrow.ref(), IndexSlots{slots0.data(), nullptr}, keys[0].data(), offsets[0].data(),
           weights[0].data(), missing_init(), dense_bags(dense.data(), kDim), num_bags[0], kDim,
           0},
          {wide.ref(), IndexSlots{slots1.data(), inverse.data()}, keys[1].data(),
           offsets[1].data(), weights[1].data(), missing_init(),
           BagRows<float>{columns_out.data(), 16, columns, 32}, num_bags[1], 8, 0}};
      const PartTotals totals = number_parts(parts, 2);
      emu::launch_pool(Parts<PoolPart<float>>{parts, {}, 2}, totals, mode, nullptr);
      for (int p = 0; p < 2; ++p) {
        for (int64_t b = 0; b < num_bags[p]; ++b) {
          const int64_t begin = offsets[p][b], end = offsets[p][b + 1];
          const float* out = parts[p].out.at(b);
          for (int64_t j = 0; j < dims[p]; ++j) {
            float sum = 0.0f;  // pooling.h's order: indices ascending, from zero
            for (int64_t i = begin; i < end; ++i) {
              const int64_t key = keys[p][i];
              const float v = key >= 0 ? row_value(key, j) : missing_element(missing_init(), key, j);
              sum += weights[p][i] * v;
            }
            if (mode == PoolingMode::kMean && end > begin)
              sum *= 1.0f / static_cast<float>(end - begin);
            CHECK(out[j] == sum, "pool: part %d, bag %lld, element %lld: %g, expected %g", p,
                  static_cast<long long>(b), static_cast<long long>(j), out[j], sum);
          }
        }
      }
    }
  });
}

/// One table's share of a backward batch as the training ops build it: its bags, the
/// distinct keys (first-occurrence order) and each index's key, their slots.
struct BackwardBatch {
  std::vector<int64_t> keys, offsets{0}, unique, inverse, unique_slots;
  std::vector<float> weights;  // empty: none
  int64_t num_bags = 0;

  void end_bag() { offsets.push_back(static_cast<int64_t>(keys.size())), ++num_bags; }
  void number_keys() {
    std::map<int64_t, int64_t> id;
    for (int64_t key : keys) {
      const auto [it, fresh] = id.emplace(key, static_cast<int64_t>(unique.size()));
      if (fresh) unique.push_back(key);
      inverse.push_back(it->second);
    }
  }
};

/// The gradient of distinct key u (dim floats) in core/pooling.h's order: its indices'
/// terms scale * grad_out[bag] ascending, in chunks of kGradientChunk each summed from
/// zero, the chunks' sums added in order to a total from zero.
std::vector<float> reference_gradient(const BackwardBatch& a, const BagRows<const float>& grad,
                                      PoolingMode mode, int64_t u, int64_t dim) {
  std::vector<float> total(dim, 0.0f), chunk(dim, 0.0f);
  int64_t in_chunk = 0;
  for (int64_t b = 0; b < a.num_bags; ++b) {
    const int64_t begin = a.offsets[b], end = a.offsets[b + 1];
    for (int64_t i = begin; i < end; ++i) {
      if (a.inverse[i] != u) continue;
      const float w = a.weights.empty() ? 1.0f : a.weights[i];
      const float scale = mode == PoolingMode::kMean ? w / static_cast<float>(end - begin) : w;
      for (int64_t j = 0; j < dim; ++j) chunk[j] += scale * grad.at(b)[j];
      if (++in_chunk == kGradientChunk) {
        for (int64_t j = 0; j < dim; ++j) total[j] += chunk[j], chunk[j] = 0.0f;
        in_chunk = 0;
      }
    }
  }
  if (in_chunk > 0)
    for (int64_t j = 0; j < dim; ++j) total[j] += chunk[j];
  return total;
}

/// Two host threads each train their own two tables (writers of different tables run
/// together) through launch_backward, one call of both parts a round: part 0 (dim 4, rows
/// of 5 columns) has a hot key with ~2,300 of its ~2,600 indices (36 gradient chunks: the
/// chunked sum), weights, and a key that is not stored (slot -1: skipped); part 1 (dim 8,
/// rows of 9) a key of 102 indices (2 chunks), an empty bag, no weights, and its
/// gradients in the columns of a feature-major matrix. Thread 0: SGD, first with SUM and
/// no weight decay, whose gradients (sums of multiples of 0.5) and rows are exact in any
/// order, so each row is w - lr * g computed here, then MEAN with weight decay; thread 1:
/// EXACT_ROWWISE_ADAGRAD with MEAN then SUM (its state carried). All but the exact round
/// against the gradients summed here in core/pooling.h's order and optimizer_rules.h's
/// update. Every stored row, with its state, must equal the one kept here, bit for bit.
void emulated_backward() {
  run_threads(2, [&](int me) {
    Table narrow(16, 32, false, kDim + 1), wide(16, 32, false, 9);
    Table* tables[2] = {&narrow, &wide};
    const int64_t dims[2] = {kDim, 8};
    constexpr int64_t kStored = 200;
    std::map<int64_t, std::vector<float>> model[2];  // key -> the row it should have
    std::vector<int64_t> stored_keys(kStored);
    for (int64_t i = 0; i < kStored; ++i) stored_keys[i] = key_of(me, i * 7 + 1);
    for (int p = 0; p < 2; ++p) {
      std::vector<float> rows(kStored * dims[p]);
      for (int64_t i = 0; i < kStored; ++i) {
        std::vector<float>& row = model[p][stored_keys[i]];
        row.assign(tables[p]->width, uniform_init().extra_value);
        for (int64_t j = 0; j < dims[p]; ++j)
          rows[i * dims[p] + j] = row[j] = row_value(stored_keys[i], j);
      }
      std::vector<int8_t> status(kStored);
      std::vector<int64_t> counts(kStatusCount);
      HeapWorkspace ws;
      AssignSink<float> sink{tables[p]->ref(), uniform_init(), dims[p], rows.data(), dims[p], {}};
      emu::launch_upsert_keys(sink, args_for(ScoreStrategy::kNoEviction, 0), stored_keys.data(),
                              kStored, status.data(), counts.data(), ws, nullptr);
      CHECK(counts[static_cast<int>(Status::kFailed)] == 0, "backward: a row not stored");
    }
    const int64_t hot = stored_keys[0], absent = key_of(me, 999'999), twice = stored_keys[1];
    for (int round = 0; round < 2; ++round) {
      const OptimizerKind kind = me == 0 ? OptimizerKind::kSgd : OptimizerKind::kRowwiseAdagrad;
      const PoolingMode mode = (me + round) % 2 == 0 ? PoolingMode::kSum : PoolingMode::kMean;
      const bool exact = me == 0 && round == 0;  // SGD, SUM, no weight decay
      const OptimizerArgs opt{kind, 0.25f, 1e-8f, 0.9f, 0.999f, exact ? 0.0f : 0.01f, round + 1};
      BackwardBatch batch[2];
      for (int64_t b = 0; b < 48; ++b) {  // part 0: the hot key 7 indices in 8
        for (int64_t k = 0; k < 52 + (b + me) % 5; ++k) {
          const int64_t x = (b * 7 + k + round) % 150 + 1;
          batch[0].keys.push_back(k % 8 != 0 ? hot : x == 77 ? absent : stored_keys[x]);
          batch[0].weights.push_back(0.5f * static_cast<float>(1 + (b + k) % 3));
        }
        batch[0].end_bag();
      }
      for (int64_t b = 0; b < 52; ++b) {  // part 1: `twice` twice a bag, bag 13 empty
        for (int64_t k = 0; b != 13 && k < 2 + (b + round) % 4; ++k)
          batch[1].keys.push_back(k < 2 ? twice : stored_keys[(b * 11 + k * 3 + me) % 190 + 2]);
        batch[1].end_bag();
      }
      CHECK(std::count(batch[0].keys.begin(), batch[0].keys.end(), hot) > 2000,
            "backward: the hot key is not hot");
      CHECK(std::count(batch[1].keys.begin(), batch[1].keys.end(), twice) == 102,
            "backward: part 1's key of two chunks");
      // Gradients: small integers (exact sums); part 1 feature-major, 2 features of 26.
      std::vector<float> grad0(48 * kDim), grad1(26 * 16);
      for (size_t e = 0; e < grad0.size(); ++e) grad0[e] = static_cast<float>((e * 5 + round) % 7) - 3;
      for (size_t e = 0; e < grad1.size(); ++e) grad1[e] = static_cast<float>((e * 3 + me) % 5) - 2;
      const int64_t columns[2] = {0, 8};
      const BagRows<const float> grads[2] = {dense_bags<const float>(grad0.data(), kDim),
                                             BagRows<const float>{grad1.data(), 16, columns, 26}};
      BackwardPart<float> parts[2];
      for (int p = 0; p < 2; ++p) {
        BackwardBatch& a = batch[p];
        a.number_keys();
        a.unique_slots.resize(a.unique.size());
        emu::launch_find_slots(tables[p]->ref(), a.unique.data(),
                               static_cast<int64_t>(a.unique.size()), a.unique_slots.data(),
                               nullptr);
        parts[p] = BackwardPart<float>{tables[p]->ref(),  a.unique_slots.data(),
                                       a.inverse.data(),  a.offsets.data(),
                                       a.weights.empty() ? nullptr : a.weights.data(),
                                       grads[p],          a.num_bags,
                                       static_cast<int64_t>(a.keys.size()),
                                       static_cast<int64_t>(a.unique.size()),
                                       dims[p],           0, 0, 0, 0};
      }
      CHECK(std::count(batch[0].unique_slots.begin(), batch[0].unique_slots.end(), -1) == 1,
            "backward: part 0 has no skipped key");
      // The rows this round should give, computed here before the launch.
      for (int p = 0; p < 2; ++p) {
        const BackwardBatch& a = batch[p];
        for (size_t u = 0; u < a.unique.size(); ++u) {
          if (a.unique_slots[u] < 0) continue;
          const std::vector<float> g =
              reference_gradient(a, grads[p], mode, static_cast<int64_t>(u), dims[p]);
          std::vector<float>& row = model[p].at(a.unique[u]);
          if (exact) {  // g by any order, then w - lr * g
            for (int64_t j = 0; j < dims[p]; ++j) {
              double sum = 0.0;
              for (int64_t b = 0; b < a.num_bags; ++b)
                for (int64_t i = a.offsets[b]; i < a.offsets[b + 1]; ++i)
                  if (a.inverse[i] == static_cast<int64_t>(u))
                    sum += (a.weights.empty() ? 1.0 : a.weights[i]) * grads[p].at(b)[j];
              CHECK(static_cast<double>(g[j]) == sum, "backward: reference gradient");
              row[j] = static_cast<float>(row[j] - 0.25 * sum);
            }
          } else if (kind == OptimizerKind::kSgd) {
            for (int64_t j = 0; j < dims[p]; ++j)
              row[j] = row[j] - opt.learning_rate * (g[j] + opt.weight_decay * row[j]);
          } else {
            update_row(opt, row.data(), dims[p], g.data());
          }
        }
      }
      HeapWorkspace ws;
      const PartTotals totals = number_parts(parts, 2);
      emu::launch_backward(Parts<BackwardPart<float>>{parts, {}, 2}, totals, mode, opt, ws,
                           nullptr);
      for (int p = 0; p < 2; ++p) {
        const Table& t = *tables[p];
        const std::map<int64_t, int64_t> slot_of = t.stored();
        CHECK(slot_of.size() == static_cast<size_t>(kStored), "backward: keys changed");
        for (const auto& [key, row] : model[p]) {
          const float* got = &t.values[slot_of.at(key) * t.width];
          for (int64_t j = 0; j < t.width; ++j)
            CHECK(got[j] == row[j],
                  "backward: round %d, part %d, key %lld%s, column %lld: %g, expected %g", round,
                  p, static_cast<long long>(key), key == hot ? " (hot)" : "",
                  static_cast<long long>(j), got[j], row[j]);
        }
      }
    }
  });
}

}  // namespace

int main(int argc, char** argv) {
  const std::pair<const char*, void (*)()> cases[] = {
      {"cpu_locked_upsert_erase_find", cpu_locked_upsert_erase_find},
      {"cpu_partitioned_evicting", cpu_partitioned_evicting},
      {"cpu_dedup_shared_set", cpu_dedup_shared_set},
      {"emulated_upsert_find_erase_rehash", emulated_upsert_find_erase_rehash},
      {"emulated_dedup", emulated_dedup},
      {"emulated_upsert_grouped", emulated_upsert_grouped},
      {"emulated_pool", emulated_pool},
      {"emulated_backward", emulated_backward},
  };
  for (const auto& [name, run] : cases) {
    // Arguments: the cases to run (all when none).
    if (argc > 1 && std::none_of(argv + 1, argv + argc,
                                 [&](const char* a) { return std::string(a) == name; }))
      continue;
    run();
    std::printf("tsan_tables: %s ok\n", name);
    std::fflush(stdout);  // TSan ends the process with _exit on a report
  }
  return 0;
}
