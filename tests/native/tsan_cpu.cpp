// ThreadSanitizer cases of the CPU executor's platform (tsan_tables.cpp).
#include "core/tile_erase.h"
#include "core/tile_ops.h"
#include "tsan_common.h"

namespace dynemb::tsan {

/// Threads upsert (AssignSink) and then erase keys by the batch rule's passes as the CPU
/// executor runs them (pass 1 a thread per home-bucket range, pass 2 one thread: core
/// tile_ops.h and tile_erase.h), then all read every key; each key's presence and row
/// must match. Each thread's rows, and the keys pass 1 leaves, are written by one thread
/// and read by another across barriers.
void cpu_partitioned_upsert_erase_find() {
  Table table(64, 128, false);  // 8192 slots, 6000 keys: some spill (tile_upsert_spill)
  const TableRef<float> t = table.ref();
  constexpr int64_t kKeys = 6000;
  std::barrier sync(kThreads);
  std::vector<std::vector<int64_t>> deferred(kThreads);
  // Erases the keys k * 1000003 + round for which erased(k) holds: pass 1 each thread
  // those of its home buckets, pass 2 thread 0 the keys pass 1 deferred.
  auto erase_where = [&](int me, int round, auto&& erased, bool must_find) {
    for (int64_t k = 0; k < kKeys; ++k) {
      const int64_t key = k * 1000003 + round;
      if (!erased(k) || bucket_of(hash_key(key), t.num_buckets) * kThreads / t.num_buckets != me) {
        continue;
      }
      const EraseHome e = tile_erase_home(SerialTile{}, t, key);
      CHECK(!must_find || e != EraseHome::kAbsent, "erase of a stored key reported absent");
      if (e == EraseHome::kDeferred) deferred[me].push_back(key);
    }
    sync.arrive_and_wait();
    if (me == 0) {
      for (auto& keys : deferred) {
        for (const int64_t key : keys) {
          CHECK(tile_erase_key(SerialTile{}, t, key) || !must_find,
                "erase of a stored key reported absent");
        }
        keys.clear();
      }
    }
    sync.arrive_and_wait();
  };
  // The rows of round `round`'s keys k * 1000003 + round, written by thread k % kThreads.
  std::vector<float> rows(kKeys * kDim);
  std::vector<std::vector<int64_t>> left(kThreads);  // pass 1's leftovers, by thread
  run_threads(kThreads, [&](int me) {
    for (int round = 0; round < 3; ++round) {
      for (int64_t k = me; k < kKeys; k += kThreads)
        for (int64_t j = 0; j < kDim; ++j) rows[k * kDim + j] = row_value(k * 1000003 + round, j);
      sync.arrive_and_wait();
      // Batch index k; no pass 0 (each key in its home bucket, the second past a flagged
      // one: pass 2), which changes what pass 1 decides, not who owns what.
      AssignSink<float> sink{t, uniform_init(), kDim, rows.data(), kDim, {}};
      const UpsertArgs u = args_for(ScoreStrategy::kNoEviction, round);
      const SerialTile one;
      for (int64_t k = 0; k < kKeys; ++k) {
        const int64_t key = k * 1000003 + round;
        const KeyProbe p(t, key);
        if (p.bucket * kThreads / t.num_buckets != me) continue;
        Status s;
        if (!tile_upsert_home(one, t, k, k, key, p, u, sink, &s)) {
          left[me].push_back(k);
          continue;
        }
        CHECK(s != Status::kFailed, "key %lld not stored", static_cast<long long>(key));
      }
      sync.arrive_and_wait();
      if (me == 0) {  // pass 2: the leftovers in batch order
        std::vector<int64_t> all;
        for (auto& l : left) {
          all.insert(all.end(), l.begin(), l.end());
          l.clear();
        }
        std::sort(all.begin(), all.end());
        for (const int64_t k : all) {
          const Status s = tile_upsert_spill(one, t, k, k, k * 1000003 + round, u, sink);
          CHECK(s != Status::kFailed, "key %lld not stored", static_cast<long long>(k));
        }
      }
      sync.arrive_and_wait();  // erases own their buckets: no upsert runs beside them
      erase_where(me, round, [](int64_t k) { return (k / kThreads) % 3 == 0; }, true);
      // readers never run beside writers (platform.h)
      for (int64_t k = 0; k < kKeys; ++k) {
        const int64_t key = k * 1000003 + round;
        const int64_t slot = tile_find_slot(SerialTile{}, t, key);
        const bool erased = (k / kThreads) % 3 == 0;
        CHECK((slot >= 0) == !erased, "key %lld: found %d, erased %d", static_cast<long long>(key),
              slot >= 0, erased);
        if (slot >= 0) CHECK(t.row(slot)[1] == row_value(key, 1), "key %lld: wrong row",
                             static_cast<long long>(key));
      }
      sync.arrive_and_wait();
      erase_where(me, round, [](int64_t) { return true; }, false);
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
        CHECK(tile_upsert_home(SerialTile{}, t, i, i, keys[i], KeyProbe(t, keys[i]), u, sink,
                               &s),
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

}  // namespace dynemb::tsan
