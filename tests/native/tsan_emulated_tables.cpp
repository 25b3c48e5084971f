// ThreadSanitizer cases of the emulated CUDA executor's table launchers (tsan_tables.cpp).
#include "tsan_common.h"

namespace dynemb::tsan {

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
        // the last round bounds the keys by a count in memory (a padded batch's live)
        const int64_t live = kPerThread;
        emu::launch_upsert_keys(sink, args_for(ScoreStrategy::kNoEviction, round), keys.data(),
                                kPerThread, round == 2 ? &live : nullptr, status.data(),
                                counts.data(), ws, nullptr);
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

/// Saved entries restored into an evicting table (RestoreSink, the checkpoint load): a
/// claim's score and the saved score that replaces it are written by one lane (a claim's
/// fields split over lanes without a sync would race), and every key keeps its own.
void emulated_restore() {
  Table table(32, 128, true);
  constexpr int64_t kKeys = 3000;
  std::vector<int64_t> keys(kKeys), saved_scores(kKeys);
  std::vector<float> values(kKeys * kDim);
  for (int64_t i = 0; i < kKeys; ++i) {
    keys[i] = (i + 1) * 998244353LL;
    saved_scores[i] = 1000 + i;
    for (int64_t j = 0; j < kDim; ++j) values[i * kDim + j] = row_value(keys[i], j);
  }
  std::vector<int8_t> status(kKeys);
  std::vector<int64_t> counts(kStatusCount);
  HeapWorkspace ws;
  RestoreSink<float> sink{table.ref(), uniform_init(), kDim,
                          SavedEntries<float>{values.data(), nullptr, 0, saved_scores.data(),
                                              nullptr},
                          {}};
  emu::launch_upsert_keys(sink, args_for(ScoreStrategy::kStep, 7), keys.data(), kKeys, nullptr,
                          status.data(), counts.data(), ws, nullptr);
  CHECK(counts[static_cast<int>(Status::kFailed)] == 0, "emulated restore failed keys");
  for (const auto& [key, slot] : table.stored()) {
    const int64_t i = key / 998244353LL - 1;
    CHECK(table.scores[slot] == static_cast<uint64_t>(saved_scores[i]),
          "emulated restore: key %lld has score %llu", static_cast<long long>(key),
          static_cast<unsigned long long>(table.scores[slot]));
    CHECK(table.values[slot * kDim + 1] == row_value(key, 1), "emulated restore row");
  }
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

}  // namespace dynemb::tsan
