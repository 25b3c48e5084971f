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
//              host threads under a reader-writer lock (dynemb/table/rw_lock.py's rule).
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

/// Owns a table's buffers (NO_EVICTION when !evicting: no scores).
struct Table {
  int64_t buckets, capacity;
  std::vector<uint8_t> digests, overflow;
  std::vector<int64_t> keys;
  std::vector<uint64_t> scores;
  std::vector<float> values;
  std::vector<uint32_t> locks;
  std::vector<uint32_t> pins;

  Table(int64_t b, int64_t c, bool evicting)
      : buckets(b), capacity(c), digests(b * c), overflow(b), keys(b * c),
        scores(evicting ? b * c : 0), values(b * c * kDim), locks(b), pins(evicting ? b * c : 0) {}

  TableRef<float> ref() {
    return TableRef<float>{digests.data(),  keys.data(),    scores.empty() ? nullptr : scores.data(),
                           nullptr,         values.data(),  nullptr,
                           locks.data(),    overflow.data(), pins.empty() ? nullptr : pins.data(),
                           buckets,         capacity,       kDim,
                           buckets * capacity};
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

}  // namespace

int main() {
  const std::pair<const char*, void (*)()> cases[] = {
      {"cpu_locked_upsert_erase_find", cpu_locked_upsert_erase_find},
      {"cpu_partitioned_evicting", cpu_partitioned_evicting},
      {"cpu_dedup_shared_set", cpu_dedup_shared_set},
      {"emulated_upsert_find_erase_rehash", emulated_upsert_find_erase_rehash},
      {"emulated_dedup", emulated_dedup},
  };
  for (const auto& [name, run] : cases) {
    run();
    std::printf("tsan_tables: %s ok\n", name);
    std::fflush(stdout);  // TSan ends the process with _exit on a report
  }
  return 0;
}
