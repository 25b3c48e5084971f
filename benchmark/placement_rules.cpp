// Placement rules of a bucketed hash table, simulated: where a key may live decides
// (1) the load factor of a NO_EVICTION table at its first failed insert and (2) the
// eviction rank of a full evicting table (DynamicEmb_APIs.md, "Eviction quality": the
// fraction of stored keys whose score is strictly below the victim's). Only bucket
// fills, group fills and scores are modelled; hash, bucket and home group are
// csrc/core/hash.h's, so figures compare with the table's own (benchmark/RESULTS.md).
//
// Rules:
//   today       the home bucket, else the next 3 buckets (a spill window of 4)
//   2c-indep    two buckets, the second from an independent hash; the emptier takes
//               the key, a miss in both fails (NO_EVICTION) or evicts the lowest
//               score of both
//   2c-nearD    as 2c-indep, the second bucket among home+1 .. home+D
//   line-X      the whole home bucket, or only the key's home line (64 slots) of its
//               second bucket (X: indep or nearD): an absent key reads one more digest
//               line; the emptier by free fraction takes the key, a full pair evicts
//               the lowest score of the home bucket and those 64 slots
//   group-X     as line-X with the key's home group (16 slots)
//   2c-near16-homeF  as 2c-near16, a new key taking its home while that holds fewer
//               than F of its slots (the table's rule: F = 13/16, home_takes_new_keys)
//
// Build and run (a scratch program, not part of the package):
//   g++ -O2 -std=c++17 -Icsrc benchmark/placement_rules.cpp -o build/placement_rules
//   build/placement_rules load SLOTS random|zipf SEEDS      (bucket_capacity 128)
//   build/placement_rules batched SLOTS random|zipf SEEDS BATCH
//   build/placement_rules evict SLOTS lru|lfu UNIVERSE ALPHA STEPS BATCH
//   build/placement_rules evict-batched SLOTS UNIVERSE ALPHA STEPS BATCH   (LRU)
// Zipf keys: distinct keys in order of first appearance in a stream drawn from a
// power law of exponent 1.2 (a Pareto variate rounded down), hashed as the table does.
#include "core/hash.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <unordered_set>
#include <unordered_map>
#include <vector>

namespace {

constexpr int kCapacity = 128;  // slots per bucket
constexpr int kGroups = kCapacity / 16;

// The table's own hash, bucket and home-group rules (csrc/core/hash.h), not copies.
using dynemb::bucket_of;
using dynemb::mix64;
int home_group_of(uint64_t h) { return static_cast<int>(dynemb::home_group_of(h, kGroups)); }

enum class Kind { kToday, kTwo, kLine, kGroup };
struct Rule {
  std::string name;
  Kind kind;
  int near;  // 0: independent second bucket, else home+1 .. home+near
  int home_limit = 0;  // "2c": a new key takes its home while it holds fewer (0: no limit)
};

struct Choice {
  int64_t b1, b2;
  int home;
};
Choice choose(const Rule& r, int64_t key, int64_t n) {
  const uint64_t h = mix64(uint64_t(key));
  const uint64_t h2 = mix64(h ^ 0x9e3779b97f4a7c15ULL);
  Choice c{bucket_of(h, n), 0, home_group_of(h)};
  if (r.kind == Kind::kToday) {
    c.b2 = c.b1;
  } else if (r.near == 0) {
    c.b2 = bucket_of(h2, n);
    if (c.b2 == c.b1) c.b2 = (c.b1 + 1) % n;
  } else {
    c.b2 = (c.b1 + 1 + int64_t(((h2 >> 32) * uint64_t(r.near)) >> 32)) % n;
  }
  return c;
}

struct Keys {
  bool zipf;
  std::mt19937_64 g;
  std::unordered_set<int64_t> seen;
  Keys(bool z, uint64_t seed) : zipf(z), g(seed) {}
  int64_t next() {  // a key not seen before
    if (!zipf) return int64_t(g());  // 64-bit random keys: a repeat is negligible
    while (true) {
      const double u = double(g() >> 11) * (1.0 / 9007199254740992.0);
      const double x = std::min(std::pow(1.0 - u, -1.0 / 0.2), 9e18);
      const int64_t k = int64_t(x);
      if (seen.insert(k).second) return k;
    }
  }
};

// Load factor at the first key that finds no slot.
double load_at_first_failure(const Rule& r, int64_t slots, bool zipf, uint64_t seed) {
  const int64_t n = slots / kCapacity;
  std::vector<int> fill(n, 0);
  std::vector<uint8_t> group_fill(n * kGroups, 0);
  Keys keys(zipf, seed);
  if (zipf) keys.seen.reserve(size_t(slots * 1.2));
  // Places a key in bucket b, groups [first, first + width) of it, in probe order.
  auto place = [&](int64_t b, int home, int first, int width) {
    for (int k = 0; k < width; ++k) {
      const int g = first + ((home - first) ^ k);
      if (group_fill[b * kGroups + g] < 16) {
        ++group_fill[b * kGroups + g];
        ++fill[b];
        return true;
      }
    }
    return false;
  };
  for (int64_t stored = 0;; ++stored) {
    const Choice c = choose(r, keys.next(), n);
    bool ok = false;
    if (r.kind == Kind::kToday) {
      for (int w = 0; w < 4 && !ok; ++w) ok = place((c.b1 + w) % n, c.home, 0, kGroups);
    } else if (r.kind == Kind::kTwo) {
      const bool home = fill[c.b1] < r.home_limit || fill[c.b2] >= fill[c.b1];
      ok = place(home ? c.b1 : c.b2, c.home, 0, kGroups);
    } else {
      const int width = r.kind == Kind::kLine ? 4 : 1;
      const int first = c.home / width * width;
      int free2 = 0;
      for (int g = first; g < first + width; ++g) free2 += 16 - group_fill[c.b2 * kGroups + g];
      const int free1 = kCapacity - fill[c.b1];
      // the emptier by free fraction; ties to the home bucket
      if (free2 * kGroups > free1 * width) ok = place(c.b2, c.home, first, width);
      else ok = place(c.b1, c.home, 0, kGroups);
    }
    if (!ok) return double(stored) / double(slots);
  }
}

// As load_at_first_failure under a "2c" rule, with the choice of bucket made per batch
// of `batch` keys from the fills before the batch (a snapshot: what a GPU's owners of
// buckets can decide without reading a bucket another owner is writing); the keys of
// a batch then take their chosen bucket in batch order and fail when it is full (or,
// with `fallback`, try the other one after the batch).
// `fallback`: a key whose chosen bucket is full tries the other one after the batch
// (a second pass, in batch order), counted in *deferred_keys.
double load_at_first_failure_batched(const Rule& r, int64_t slots, bool zipf, uint64_t seed,
                                     int64_t batch, bool fallback, int64_t* deferred_keys) {
  const int64_t n = slots / kCapacity;
  std::vector<int> fill(n, 0);
  Keys keys(zipf, seed);
  if (zipf) keys.seen.reserve(size_t(slots * 1.2));
  std::vector<int64_t> chosen(batch), first(batch), second(batch), deferred;
  for (int64_t stored = 0;;) {
    for (int64_t j = 0; j < batch; ++j) {
      const Choice c = choose(r, keys.next(), n);
      first[j] = c.b1;
      second[j] = c.b2;
      chosen[j] = fill[c.b2] < fill[c.b1] ? c.b2 : c.b1;
    }
    deferred.clear();
    for (int64_t j = 0; j < batch; ++j) {
      if (fill[chosen[j]] == kCapacity) {
        if (!fallback) return double(stored) / double(slots);
        deferred.push_back(j);
        continue;
      }
      ++fill[chosen[j]];
      ++stored;
    }
    *deferred_keys += int64_t(deferred.size());
    for (const int64_t j : deferred) {  // pass 2, in batch order: the other bucket
      const int64_t other = chosen[j] == first[j] ? second[j] : first[j];
      if (fill[other] == kCapacity) return double(stored) / double(slots);
      ++fill[other];
      ++stored;
    }
  }
}

struct Fenwick {  // counts of stored scores; below(s): how many are < s
  std::vector<int64_t> t;
  explicit Fenwick(size_t n) : t(n + 1, 0) {}
  void add(int64_t i, int64_t v) {
    for (++i; i < int64_t(t.size()); i += i & -i) t[i] += v;
  }
  int64_t below(int64_t i) const {
    int64_t s = 0;
    for (; i > 0; i -= i & -i) s += t[i];
    return s;
  }
};

// A full evicting table on a Zipf stream over `universe` ids, batches of `batch`
// keys: LRU scores are the step number, LFU scores the access count. A new key takes
// a free slot of the emptier choice, else evicts the lowest score of its home bucket
// (and, under two choices, of the slots of the second bucket open to it); keys of the
// current step are not victims (the table's pins). Ranks of the last three quarters
// of the steps.
void eviction_rank(const Rule& r, int64_t slots, bool lfu, int64_t universe, double alpha,
                   int64_t steps, int batch) {
  const int64_t n = slots / kCapacity;
  std::vector<int64_t> key(slots, 0);
  std::vector<uint64_t> score(slots, 0);
  std::vector<char> used(slots, 0);
  std::vector<int> fill(n, 0);
  std::unordered_map<int64_t, int64_t> where;
  where.reserve(size_t(slots) * 2);
  std::vector<double> cdf(universe);
  double total = 0;
  for (int64_t i = 0; i < universe; ++i) cdf[i] = total += std::pow(double(i + 1), -alpha);
  for (double& c : cdf) c /= total;
  std::mt19937_64 g(99);
  Fenwick stored_scores(lfu ? size_t(steps * batch + 2) : size_t(steps + 2));
  int64_t stored = 0, evictions = 0, lowest_decile = 0;
  double rank_sum = 0;
  for (int64_t step = 1; step <= steps; ++step) {
    for (int j = 0; j < batch; ++j) {
      const double u = double(g() >> 11) * (1.0 / 9007199254740992.0);
      const int64_t id = std::lower_bound(cdf.begin(), cdf.end(), u) - cdf.begin();
      const int64_t k = int64_t(mix64(uint64_t(id) * 0x2545F4914F6CDD1DULL + 7));
      auto it = where.find(k);
      if (it != where.end()) {
        const int64_t s = it->second;
        stored_scores.add(int64_t(score[s]), -1);
        score[s] = lfu ? score[s] + 1 : uint64_t(step);
        stored_scores.add(int64_t(score[s]), 1);
        continue;
      }
      const Choice c = choose(r, k, n);
      // the second bucket's slots open to the key: all, its home line or its home group
      const int width = r.kind == Kind::kLine ? 64 : r.kind == Kind::kGroup ? 16 : kCapacity;
      const int64_t first2 = c.b2 * kCapacity + (c.home * 16 / width) * width;
      int free2 = 0;
      for (int i = 0; i < width; ++i) free2 += !used[first2 + i];
      const int free1 = kCapacity - fill[c.b1];
      const bool second = r.kind != Kind::kToday && int64_t(free2) * kCapacity > int64_t(free1) * width;
      int64_t slot = -1;
      if (second || free1 > 0) {
        const int64_t first = second ? first2 : c.b1 * kCapacity;
        for (int i = 0; i < (second ? width : kCapacity) && slot < 0; ++i) {
          if (!used[first + i]) slot = first + i;
        }
        used[slot] = 1;
        ++fill[slot / kCapacity];
        ++stored;
      } else {
        auto scan = [&](int64_t first, int count) {
          for (int i = 0; i < count; ++i) {
            const int64_t q = first + i;
            if (!lfu && score[q] == uint64_t(step)) continue;
            if (slot < 0 || score[q] < score[slot]) slot = q;
          }
        };
        scan(c.b1 * kCapacity, kCapacity);
        if (r.kind != Kind::kToday) scan(first2, width);
        if (slot < 0) continue;  // all pinned: the key fails
        if (step > steps / 4) {
          const double rank = double(stored_scores.below(int64_t(score[slot]))) / double(stored);
          rank_sum += rank;
          lowest_decile += rank < 0.1;
          ++evictions;
        }
        where.erase(key[slot]);
        stored_scores.add(int64_t(score[slot]), -1);
      }
      key[slot] = k;
      score[slot] = lfu ? 1 : uint64_t(step);
      stored_scores.add(int64_t(score[slot]), 1);
      where[k] = slot;
    }
  }
  std::printf("evict %s slots=%lld universe=%lld alpha=%.2f steps=%lld batch=%d rule=%-12s "
              "rank_mean=%.5f lowest_decile=%.4f evictions=%lld\n",
              lfu ? "lfu" : "lru", (long long)slots, (long long)universe, alpha,
              (long long)steps, batch, r.name.c_str(), evictions ? rank_sum / evictions : 0.0,
              evictions ? double(lowest_decile) / evictions : 0.0, (long long)evictions);
  std::fflush(stdout);
}

// eviction_rank with a batch's keys handled as the table's batch rule does: every
// stored key of the step is touched first, then the new ones (each once) are placed
// in batch order. `snapshot`: each new key's bucket is picked from the state after the
// touches (the emptier; when both are full, the one whose lowest score not of this
// step is lower), and it takes a free slot or the victim of that bucket only (what
// owners of buckets can decide on a GPU); else (live) it sees the keys placed before
// it and evicts the lowest score of both buckets.
void eviction_rank_batched(const Rule& r, int64_t slots, int64_t universe, double alpha,
                           int64_t steps, int batch, bool snapshot) {
  const int64_t n = slots / kCapacity;
  std::vector<int64_t> key(slots, 0);
  std::vector<uint64_t> score(slots, 0);
  std::vector<char> used(slots, 0);
  std::vector<int> fill(n, 0);
  std::unordered_map<int64_t, int64_t> where;
  where.reserve(size_t(slots) * 2);
  std::vector<double> cdf(universe);
  double total = 0;
  for (int64_t i = 0; i < universe; ++i) cdf[i] = total += std::pow(double(i + 1), -alpha);
  for (double& c : cdf) c /= total;
  std::mt19937_64 g(99);
  Fenwick stored_scores(size_t(steps + 2));
  int64_t stored = 0, evictions = 0, lowest_decile = 0;
  double rank_sum = 0;
  const bool two = r.kind != Kind::kToday;
  auto lowest = [&](int64_t b, int64_t step) {  // the lowest slot not of this step, or -1
    int64_t best = -1;
    for (int i = 0; i < kCapacity; ++i) {
      const int64_t q = b * kCapacity + i;
      if (!used[q] || score[q] == uint64_t(step)) continue;
      if (best < 0 || score[q] < score[best]) best = q;
    }
    return best;
  };
  std::vector<int64_t> fresh, target;
  std::unordered_set<int64_t> in_batch;
  for (int64_t step = 1; step <= steps; ++step) {
    fresh.clear();
    in_batch.clear();
    for (int j = 0; j < batch; ++j) {
      const double u = double(g() >> 11) * (1.0 / 9007199254740992.0);
      const int64_t id = std::lower_bound(cdf.begin(), cdf.end(), u) - cdf.begin();
      const int64_t k = int64_t(mix64(uint64_t(id) * 0x2545F4914F6CDD1DULL + 7));
      auto it = where.find(k);
      if (it != where.end()) {
        const int64_t s = it->second;
        stored_scores.add(int64_t(score[s]), -1);
        score[s] = uint64_t(step);
        stored_scores.add(int64_t(score[s]), 1);
      } else if (in_batch.insert(k).second) {
        fresh.push_back(k);
      }
    }
    target.assign(fresh.size(), -1);
    if (snapshot) {
      for (size_t j = 0; j < fresh.size(); ++j) {
        const Choice c = choose(r, fresh[j], n);
        if (!two || fill[c.b1] < kCapacity || fill[c.b2] < kCapacity) {
          target[j] = two && fill[c.b2] < fill[c.b1] ? c.b2 : c.b1;
        } else {
          const int64_t v1 = lowest(c.b1, step), v2 = lowest(c.b2, step);
          target[j] = v2 >= 0 && (v1 < 0 || score[v2] < score[v1]) ? c.b2 : c.b1;
        }
      }
    }
    for (size_t j = 0; j < fresh.size(); ++j) {
      const int64_t k = fresh[j];
      const Choice c = choose(r, k, n);
      int64_t slot = -1;
      int64_t b = target[j];
      if (b < 0) b = two && fill[c.b2] < fill[c.b1] ? c.b2 : c.b1;
      if (fill[b] < kCapacity) {
        for (int i = 0; i < kCapacity && slot < 0; ++i) {
          if (!used[b * kCapacity + i]) slot = b * kCapacity + i;
        }
        used[slot] = 1;
        ++fill[b];
        ++stored;
      } else {
        slot = lowest(b, step);
        if (!snapshot && two) {
          const int64_t other = lowest(b == c.b1 ? c.b2 : c.b1, step);
          if (other >= 0 && (slot < 0 || score[other] < score[slot])) slot = other;
        }
        if (slot < 0) continue;  // all of this step: the key fails
        if (step > steps / 4) {
          const double rank = double(stored_scores.below(int64_t(score[slot]))) / double(stored);
          rank_sum += rank;
          lowest_decile += rank < 0.1;
          ++evictions;
        }
        where.erase(key[slot]);
        stored_scores.add(int64_t(score[slot]), -1);
      }
      key[slot] = k;
      score[slot] = uint64_t(step);
      stored_scores.add(int64_t(score[slot]), 1);
      where[k] = slot;
    }
  }
  std::printf("evict-batched lru slots=%lld universe=%lld alpha=%.2f steps=%lld batch=%d "
              "rule=%-12s %s rank_mean=%.5f lowest_decile=%.4f evictions=%lld\n",
              (long long)slots, (long long)universe, alpha, (long long)steps, batch,
              r.name.c_str(), snapshot ? "snapshot" : "live    ",
              evictions ? rank_sum / evictions : 0.0,
              evictions ? double(lowest_decile) / evictions : 0.0, (long long)evictions);
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<Rule> rules = {
      {"today", Kind::kToday, 0},       {"2c-indep", Kind::kTwo, 0},
      {"2c-near8", Kind::kTwo, 8},      {"2c-near16", Kind::kTwo, 16},
      {"2c-near32", Kind::kTwo, 32},    {"line-indep", Kind::kLine, 0},
      {"line-near16", Kind::kLine, 16}, {"line-near64", Kind::kLine, 64},
      {"group-indep", Kind::kGroup, 0}, {"group-near16", Kind::kGroup, 16},
      {"2c-near16-home7/8", Kind::kTwo, 16, 112}, {"2c-near16-home15/16", Kind::kTwo, 16, 120},
      {"2c-near16-home31/32", Kind::kTwo, 16, 124}, {"2c-near16-home3/4", Kind::kTwo, 16, 96}, {"2c-near16-home13/16", Kind::kTwo, 16, 104},
  };
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "load" && argc == 5) {
    const int64_t slots = std::atoll(argv[2]);
    const bool zipf = std::string(argv[3]) == "zipf";
    const int seeds = std::atoi(argv[4]);
    for (const Rule& r : rules) {
      double lo = 1, sum = 0;
      for (int s = 0; s < seeds; ++s) {
        const double l = load_at_first_failure(r, slots, zipf, 1234 + s);
        lo = std::min(lo, l);
        sum += l;
      }
      std::printf("load slots=%lld keys=%s rule=%-12s mean=%.4f min=%.4f seeds=%d\n",
                  (long long)slots, argv[3], r.name.c_str(), sum / seeds, lo, seeds);
      std::fflush(stdout);
    }
    return 0;
  }
  if (mode == "batched" && argc == 6) {
    const int64_t slots = std::atoll(argv[2]);
    const bool zipf = std::string(argv[3]) == "zipf";
    const int64_t batch = std::atoll(argv[5]);
    for (const Rule& r : rules) {
      if (r.kind != Kind::kTwo) continue;
      for (const bool fallback : {false, true}) {
        double lo = 1, sum = 0;
        int64_t deferred = 0;
        const int seeds = std::atoi(argv[4]);
        for (int s = 0; s < seeds; ++s) {
          const double l =
              load_at_first_failure_batched(r, slots, zipf, 1234 + s, batch, fallback, &deferred);
          lo = std::min(lo, l);
          sum += l;
        }
        std::printf("batched slots=%lld keys=%s batch=%lld rule=%-12s fallback=%d mean=%.4f "
                    "min=%.4f deferred/slot=%.4f seeds=%d\n",
                    (long long)slots, argv[3], (long long)batch, r.name.c_str(), int(fallback),
                    sum / seeds, lo, double(deferred) / double(slots) / seeds, seeds);
        std::fflush(stdout);
      }
    }
    return 0;
  }
  if (mode == "evict-batched" && argc == 7) {
    for (const Rule& r : rules) {
      if (r.kind != Kind::kToday && r.kind != Kind::kTwo) continue;
      for (const bool snapshot : {false, true}) {
        if (snapshot && r.kind == Kind::kToday) continue;
        eviction_rank_batched(r, std::atoll(argv[2]), std::atoll(argv[3]), std::atof(argv[4]),
                              std::atoll(argv[5]), std::atoi(argv[6]), snapshot);
      }
    }
    return 0;
  }
  if (mode == "evict" && argc == 8) {
    for (const Rule& r : rules) {
      eviction_rank(r, std::atoll(argv[2]), std::string(argv[3]) == "lfu", std::atoll(argv[4]),
                    std::atof(argv[5]), std::atoll(argv[6]), std::atoi(argv[7]));
    }
    return 0;
  }
  std::fprintf(stderr, "usage: %s load SLOTS random|zipf SEEDS | batched SLOTS random|zipf SEEDS "
                       "BATCH | evict SLOTS lru|lfu UNIVERSE ALPHA STEPS BATCH | evict-batched SLOTS UNIVERSE ALPHA "
                       "STEPS BATCH\n", argv[0]);
  return 2;
}
