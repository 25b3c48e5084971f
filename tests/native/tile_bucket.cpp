// The tile scans of a bucket (core/bucket_tile.h) against their definitions (a find,
// the first free slot in probe order, core/bucket.h "Holes", the eviction victim), on
// random buckets: empty, full and mixed, digests and scores drawn
// from few values (ties), pins, every eviction floor. Tiles of 8, 16 and 32 lanes run
// as kernels on the emulated executor's lockstep warps; the SerialTile on the host.
// Also: a row initialised by the lanes of a tile (init_row with Lanes, each lane its
// elements) equals init_row's, for every initializer and odd and even widths; a row
// copied (copy_row with Lanes, 16-byte moves) or zeroed by them equals the serial copy
// at every alignment of source and destination, and every one of these moves gives
// element j to the same lane, (j / row_chunk) % lanes.
// And the CPU executor's BucketVictims (cpu/victim_order.h): on the same random
// buckets, each of its answers is the victim by definition as the bucket stands, while the
// victims it gives are claimed (pinned, given a new score and key) or left unclaimed.
// Built and run by tests/csrc/test_tile_bucket.py:
//   tile_bucket SEED   prints "ok" and exits 0, or prints the first difference and exits 1
#define DYNEMB_CUDA_EMULATION 1

#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "core/batch_sinks.h"
#include "core/bucket_tile.h"
#include "core/initializer.h"
#include "cpu/victim_order.h"
#include "cuda/tile.cuh"

namespace {

using dynemb::TableRef;
using dynemb::cuda_emulated::CgTile;

/// The first empty slot of `bucket` in the probe order `order` (core/bucket.h), or -1.
int64_t first_free(const TableRef<float>& t, int64_t bucket, const dynemb::ProbeOrder& order) {
  for (int64_t k = 0; k < order.span; ++k) {
    const int64_t g = order.group(k);
    if (g < 0) continue;
    for (int64_t s = bucket * t.bucket_capacity + 16 * g, j = 0; j < 16; ++j, ++s) {
      if (t.digests[s] == 0) return s;
    }
  }
  return -1;
}

/// The victim of `bucket` by its definition (core/bucket_tile.h tile_victim_in): among
/// the slots not pinned (by `pin_floor` when `pins`, by `evict_below` on the score
/// under `mask`), the smallest (score, digest, key), keys in signed order; or -1.
int64_t victim_by_definition(const TableRef<float>& t, int64_t bucket, uint64_t mask,
                             uint64_t evict_below, uint32_t pin_floor, bool pins) {
  int64_t best = -1;
  for (int64_t s = bucket * t.bucket_capacity; s < (bucket + 1) * t.bucket_capacity; ++s) {
    if (pins && t.pins[s] >= pin_floor) continue;
    if (evict_below != dynemb::kEvictAny && (t.scores[s] & mask) >= evict_below) continue;
    if (best < 0 || std::tie(t.scores[s], t.digests[s], t.keys[s]) <
                        std::tie(t.scores[best], t.digests[best], t.keys[best])) {
      best = s;
    }
  }
  return best;
}

/// A find that reads the key's home line (probe positions [0, 4)) first, by
/// core/bucket.h's "Holes": the key's slot there; else -1 when the line holds an empty
/// slot and the bucket no kHoled; else `whole`, the key's slot anywhere in the bucket.
int64_t find_from_home_line(const TableRef<float>& t, int64_t bucket, int64_t key,
                            uint8_t digest, const dynemb::ProbeOrder& order, int64_t whole) {
  bool room = false;
  for (int64_t k = 0; k < 4 && k < order.span; ++k) {
    const int64_t g = order.group(k);
    if (g < 0) continue;
    for (int64_t s = bucket * t.bucket_capacity + 16 * g, j = 0; j < 16; ++j, ++s) {
      if (t.digests[s] == digest && t.keys[s] == key) return s;
      room = room || t.digests[s] == 0;
    }
  }
  return room && !t.holed(bucket) ? -1 : whole;
}

/// One probe of one bucket: a find, a free-slot search, a victim search.
struct Query {
  int64_t bucket;
  int64_t key;
  uint8_t digest;
  int64_t home;  // home group of the probe order
  uint64_t pin_mask;
  uint64_t evict_below;
  uint32_t pin_floor;
};

struct Answer {
  int64_t find, free, victim, victim_unpinned;
  int64_t find_home;  // the find scanning the home group's digest line first
  int64_t probe_slot, probe_free;  // tile_bucket_probe: find_home, then free for a miss
  bool operator==(const Answer& o) const {
    return find == o.find && free == o.free && victim == o.victim &&
           victim_unpinned == o.victim_unpinned && find_home == o.find_home &&
           probe_slot == o.probe_slot && probe_free == o.probe_free;
  }
};

dynemb::ProbeOrder order_of(const TableRef<float>& t, int64_t home) {
  dynemb::ProbeOrder o;
  o.groups = t.bucket_capacity / 16;
  o.home = home;
  o.span = dynemb::ProbeOrder::power_of_two_at_least(o.groups);
  return o;
}

template <class Tile>
Answer tile_answer(const Tile& tile, const TableRef<float>& t, const Query& q) {
  Answer a;
  a.find = dynemb::tile_bucket_find(tile, t, q.bucket, q.key, q.digest);
  a.find_home = dynemb::tile_bucket_find(tile, t, q.bucket, q.key, q.digest, q.home);
  a.free = dynemb::tile_free_slot(tile, t, q.bucket, order_of(t, q.home));
  const dynemb::TileProbe p =
      dynemb::tile_bucket_probe(tile, t, q.bucket, q.key, q.digest, order_of(t, q.home));
  a.probe_slot = p.slot;
  a.probe_free = p.free;
  a.victim = dynemb::tile_victim_in<true>(tile, t, q.bucket, q.pin_mask, q.evict_below,
                                          q.pin_floor);
  a.victim_unpinned = dynemb::tile_victim_in<false>(tile, t, q.bucket, q.pin_mask,
                                                    q.evict_below, q.pin_floor);
  return a;
}

Answer defined_answer(const TableRef<float>& t, const Query& q) {
  const dynemb::ProbeOrder order = order_of(t, q.home);
  Answer a;
  a.find = -1;  // the whole bucket, as tile_bucket_find without a home group scans it
  for (int64_t s = q.bucket * t.bucket_capacity; s < (q.bucket + 1) * t.bucket_capacity; ++s) {
    if (t.digests[s] == q.digest && t.keys[s] == q.key) a.find = s;
  }
  // From the home line, a miss stops there past an empty slot of a bucket without
  // kHoled: in these random buckets that may miss a key stored further on, in the
  // tile's scan and by the definition alike.
  a.find_home = find_from_home_line(t, q.bucket, q.key, q.digest, order, a.find);
  a.free = first_free(t, q.bucket, order);
  a.probe_slot = a.find_home;
  a.probe_free = a.find_home >= 0 ? -1 : a.free;  // a hit looks for no free slot
  a.victim = victim_by_definition(t, q.bucket, q.pin_mask, q.evict_below, q.pin_floor, true);
  // tile_victim (its pin column read only where it must) decides as <true> on a table
  // with pins: a difference shows as victim -3, which no tile answers.
  const dynemb::SerialTile one;
  if (dynemb::tile_victim(one, t, q.bucket, q.pin_mask, q.evict_below, q.pin_floor) != a.victim) {
    a.victim = -3;
  }
  a.victim_unpinned =
      victim_by_definition(t, q.bucket, q.pin_mask, q.evict_below, q.pin_floor, false);
  return a;
}

template <unsigned N>
__global__ void tile_kernel(TableRef<float> t, const Query* queries, int64_t n, Answer* out) {
  const int64_t i = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / N;
  if (i >= n) return;
  const CgTile<N> tile;
  const Answer a = tile_answer(tile, t, queries[i]);
  // Every lane must hold the answer: lanes other than 0 check theirs against lane 0's.
  const Answer first{tile.shfl(a.find, 0), tile.shfl(a.free, 0), tile.shfl(a.victim, 0),
                     tile.shfl(a.victim_unpinned, 0), tile.shfl(a.find_home, 0),
                     tile.shfl(a.probe_slot, 0), tile.shfl(a.probe_free, 0)};
  if (tile.rank() == 0) out[i] = a;
  if (!(first == a)) out[i].find = -2;  // lanes disagree: no serial answer is -2
}

/// A table of `buckets` random buckets of `capacity` slots.
struct RandomTable {
  std::vector<uint8_t> digests;
  std::vector<int64_t> keys;
  std::vector<uint64_t> scores;
  std::vector<uint32_t> pins;
  std::vector<uint8_t> flags;
  TableRef<float> t{};

  RandomTable(std::mt19937_64& rng, int64_t buckets, int64_t capacity)
      : digests(buckets * capacity), keys(buckets * capacity), scores(buckets * capacity),
        pins(buckets * capacity), flags(buckets) {
    for (int64_t b = 0; b < buckets; ++b) {
      // Random slots have holes anywhere: with kHoled a scan from the home line reads
      // the whole bucket; without it a miss stops at an empty slot of the home line.
      flags[b] = static_cast<uint8_t>(rng() % 4);
      const int kind = static_cast<int>(rng() % 4);  // 0 empty, 1 full, 2-3 mixed
      const int digest_values = 1 + static_cast<int>(rng() % 4);  // few: ties
      for (int64_t i = 0; i < capacity; ++i) {
        const int64_t s = b * capacity + i;
        const bool empty = kind == 0 || (kind >= 2 && rng() % 3 == 0);
        digests[s] = empty ? 0 : static_cast<uint8_t>(1 + rng() % digest_values);
        // Distinct keys within a bucket (a key holds one slot), of both signs.
        keys[s] = static_cast<int64_t>((rng() % 1000) * capacity + i) * (rng() % 2 ? 1 : -1);
        const int r = static_cast<int>(rng() % 8);
        scores[s] = r == 7 ? ~uint64_t{0} : r == 6 ? (uint64_t{1} << 40) + rng() % 2 : rng() % 3;
        pins[s] = static_cast<uint32_t>(rng() % 4);
      }
    }
    t.digests = digests.data();
    t.keys = keys.data();
    t.scores = scores.data();
    t.pins = pins.data();
    t.overflow = flags.data();
    t.num_buckets = buckets;
    t.bucket_capacity = capacity;
  }
};

std::vector<Query> random_queries(std::mt19937_64& rng, const RandomTable& table, int64_t n) {
  const TableRef<float>& t = table.t;
  const uint64_t masks[] = {~uint64_t{0}, 0xFFFFFFFFu, 0};
  const uint64_t floors[] = {dynemb::kEvictAny, 0, 1, 2, 3, uint64_t{1} << 40};
  const uint32_t pin_floors[] = {dynemb::kNoPins, 0, 1, 2, 3};
  std::vector<Query> queries(n);
  for (Query& q : queries) {
    q.bucket = static_cast<int64_t>(rng() % t.num_buckets);
    const int64_t s = q.bucket * t.bucket_capacity + static_cast<int64_t>(rng() % t.bucket_capacity);
    const bool stored = table.digests[s] != 0 && rng() % 4 != 0;
    q.key = stored ? table.keys[s] : static_cast<int64_t>(rng() % 1000) * t.bucket_capacity;
    q.digest = stored ? table.digests[s] : static_cast<uint8_t>(1 + rng() % 4);
    q.home = static_cast<int64_t>(rng() % (t.bucket_capacity / 16));
    q.pin_mask = masks[rng() % 3];
    q.evict_below = floors[rng() % 6];
    q.pin_floor = pin_floors[rng() % 5];
  }
  return queries;
}

std::string show(const Answer& a) {
  return "find " + std::to_string(a.find) + ", free " + std::to_string(a.free) + ", victim " +
         std::to_string(a.victim) + ", victim without pins " + std::to_string(a.victim_unpinned) +
         ", find from the home line " + std::to_string(a.find_home);
}

template <unsigned N>
void launch(const TableRef<float>& t, const std::vector<Query>& q, std::vector<Answer>& out) {
  const auto threads = static_cast<unsigned>(q.size() * N);
  DYNEMB_LAUNCH((threads + 255) / 256, 256, nullptr, tile_kernel<N>)(t, q.data(),
                                                                    static_cast<int64_t>(q.size()),
                                                                    out.data());
}

/// The first answer of BucketVictims that differs from the victim's definition on a copy of
/// `table` whose victims are claimed as an upsert claims them (pinned at or above the
/// floor, new score, digest and key) or, now and then, left as they are (a newcomer
/// the strategy did not admit), or an empty string.
std::string victim_levels_difference(std::mt19937_64& rng, const RandomTable& table) {
  const uint64_t masks[] = {~uint64_t{0}, 0xFFFFFFFFu, 0};
  const uint64_t floors[] = {dynemb::kEvictAny, 0, 1, 2, 3, uint64_t{1} << 40};
  std::vector<int32_t> scratch(2 * table.t.bucket_capacity);
  for (int64_t b = 0; b < table.t.num_buckets; ++b) {
    for (int q = 0; q < 6; ++q) {
      std::vector<uint8_t> digests = table.digests;
      std::vector<int64_t> keys = table.keys;
      std::vector<uint64_t> scores = table.scores;
      std::vector<uint32_t> pins = table.pins;
      TableRef<float> t = table.t;
      t.digests = digests.data();
      t.keys = keys.data();
      t.scores = scores.data();
      t.pins = pins.data();
      const uint64_t mask = masks[rng() % 3];
      const uint64_t below = floors[rng() % 6];
      const auto pin_floor = static_cast<uint32_t>(rng() % 4);
      dynemb::cpu::BucketVictims<float> victims(t, b, mask, below, pin_floor, scratch);
      int none = 0;  // answers of -1 so far
      for (int64_t answers = 0;; ++answers) {
        const int64_t want = victim_by_definition(t, b, mask, below, pin_floor, true);
        const int64_t got = victims.front();
        if (got != want) {
          return "BucketVictims, capacity " + std::to_string(t.bucket_capacity) + ", bucket " +
                 std::to_string(b) + ", after " + std::to_string(answers) + " answers: " +
                 std::to_string(got) + ", by definition " + std::to_string(want);
        }
        if (want < 0 && ++none > 2) break;  // asked again: still none
        if (want < 0 || rng() % 5 == 0) continue;  // not admitted: the bucket stays as it is
        pins[want] = pin_floor + static_cast<uint32_t>(rng() % 2);
        scores[want] = rng() % 3;
        digests[want] = static_cast<uint8_t>(1 + rng() % 4);
        keys[want] = -1000000 - want;  // distinct from every key RandomTable draws
        victims.pop();
      }
    }
  }
  return "";
}

/// The first element where init_row by lanes differs from init_row, or an empty string.
std::string lanes_init_difference() {
  for (int64_t mode = 0; mode < dynemb::kInitModeCount; ++mode) {
    const dynemb::InitArgs a{static_cast<dynemb::InitMode>(mode), -0.5f, 0.75f, -1.0f, 1.5f,
                             0.25f, 12345};
    for (int64_t dim : {1, 7, 8, 33, 64}) {
      const int64_t width = dim + 3;
      for (int64_t key : {int64_t{0}, int64_t{-7}, int64_t{1} << 40}) {
        std::vector<float> want(width), got(width, -99.0f), row(width, -99.0f);
        std::vector<float> copy(dim, -99.0f);  // the row's first dim elements, beside
        dynemb::init_row(a, key, want.data(), dim, width);
        for (int64_t lanes : {1, 8, 32}) {
          for (int64_t r = 0; r < lanes; ++r) {
            dynemb::init_row(a, key, got.data(), dim, width, dynemb::Lanes{r, lanes});
            dynemb::init_row(a, key, row.data(), dim, width, dynemb::Lanes{r, lanes},
                             copy.data(), dim);
          }
          for (int64_t j = 0; j < width; ++j) {
            if (got[j] != want[j] || row[j] != want[j] || (j < dim && copy[j] != want[j])) {
              return "init_row by " + std::to_string(lanes) + " lanes, mode " +
                     std::to_string(mode) + ", dim " + std::to_string(dim) + ", element " +
                     std::to_string(j) + ": " + std::to_string(got[j]) + ", serial " +
                     std::to_string(want[j]);
            }
          }
        }
      }
    }
  }
  return "";
}

/// The lane that owns element j of a row moved by `lanes` lanes (core Lanes).
template <class V>
int64_t owner(int64_t j, int64_t lanes) {
  return j / dynemb::row_chunk<V>() % lanes;
}

/// The first difference of copy_row, zero_row and init_row by lanes from the serial
/// copy (values, bit for bit) or from the ownership rule (elements each lane writes),
/// for rows of V at element offsets 0 .. 3 of 16-byte aligned buffers, or "".
template <class V>
std::string lanes_move_difference(const char* type) {
  const dynemb::InitArgs init{dynemb::InitMode::kNormal, 0.0f, 1.0f, -2.0f, 2.0f, 0.0f, 7};
  const V mark = static_cast<V>(-99.0f);
  for (int64_t n : {1, 3, 4, 7, 8, 9, 16, 33, 64, 130}) {
    std::vector<V> src_buf(n + 16), dst_buf(n + 16);
    for (int64_t j = 0; j < n + 16; ++j) src_buf[j] = static_cast<V>(0.5f * j + 1.0f);
    for (int64_t so : {0, 1, 2, 3}) {
      for (int64_t d_off : {0, 1, 3}) {
        for (int64_t lanes : {1, 8, 16, 32}) {
          for (int op = 0; op < 3; ++op) {
            std::vector<int64_t> writer(n, -1);
            for (int64_t r = 0; r < lanes; ++r) {
              // 16-byte aligned storage: the element offsets make the misalignments.
              alignas(16) V src[160 + 16];
              alignas(16) V dst[160 + 16];
              for (int64_t j = 0; j < n + 16; ++j) src[j] = src_buf[j], dst[j] = mark;
              const dynemb::Lanes l{r, lanes};
              if (op == 0) dynemb::copy_row(src + so, dst + d_off, n, l);
              if (op == 1) dynemb::zero_row(dst + d_off, n, l);
              if (op == 2) dynemb::init_row(init, 5, dst + d_off, n, n, l);
              for (int64_t j = 0; j < n + 16; ++j) {
                const int64_t k = j - d_off;
                if (k < 0 || k >= n) {
                  if (!(dst[j] == mark)) return std::string(type) + ": wrote outside the row";
                  continue;
                }
                if (dst[j] == mark) continue;  // not this lane's
                if (writer[k] >= 0) {
                  return std::string(type) + ": element " + std::to_string(k) +
                         " written by two lanes";
                }
                writer[k] = r;
                V want = static_cast<V>(0.0f);
                if (op == 0) want = src[so + k];
                if (op == 2) {
                  std::vector<V> row(n);
                  dynemb::init_row(init, 5, row.data(), n, n);
                  want = row[k];
                }
                if (std::memcmp(&dst[j], &want, sizeof(V)) != 0) {
                  return std::string(type) + ": op " + std::to_string(op) + ", " +
                         std::to_string(lanes) + " lanes, n " + std::to_string(n) +
                         ", element " + std::to_string(k) + " differs";
                }
              }
            }
            for (int64_t k = 0; k < n; ++k) {
              if (writer[k] != owner<V>(k, lanes)) {
                return std::string(type) + ": op " + std::to_string(op) + ", " +
                       std::to_string(lanes) + " lanes, n " + std::to_string(n) + ", element " +
                       std::to_string(k) + " written by lane " + std::to_string(writer[k]) +
                       ", owner " + std::to_string(owner<V>(k, lanes));
              }
            }
          }
        }
      }
    }
  }
  return "";
}

}  // namespace

int main(int argc, char** argv) {
  const uint64_t seed = argc > 1 ? std::stoull(argv[1]) : 1;
  std::mt19937_64 rng(seed);
  int64_t checked = 0;
  for (int64_t capacity : {16, 32, 48, 64, 80, 128, 256}) {
    const RandomTable table(rng, 48, capacity);
    const std::string victims_diff = victim_levels_difference(rng, table);
    if (!victims_diff.empty()) {
      std::printf("%s (seed %llu)\n", victims_diff.c_str(), static_cast<unsigned long long>(seed));
      return 1;
    }
    const std::vector<Query> queries = random_queries(rng, table, 400);
    for (unsigned lanes : {1u, 8u, 16u, 32u}) {
      std::vector<Answer> got(queries.size());
      if (lanes == 1) {
        for (size_t i = 0; i < queries.size(); ++i) {
          got[i] = tile_answer(dynemb::SerialTile{}, table.t, queries[i]);
        }
      } else if (lanes == 8) {
        launch<8>(table.t, queries, got);
      } else if (lanes == 16) {
        launch<16>(table.t, queries, got);
      } else {
        launch<32>(table.t, queries, got);
      }
      for (size_t i = 0; i < queries.size(); ++i) {
        const Answer want = defined_answer(table.t, queries[i]);
        if (!(got[i] == want)) {
          std::printf("capacity %lld, tile of %u lanes, query %zu (bucket %lld): %s; defined: %s "
                      "(seed %llu, DYNEMB_EMULATION_SEED=%llu)\n",
                      static_cast<long long>(capacity), lanes, i,
                      static_cast<long long>(queries[i].bucket), show(got[i]).c_str(),
                      show(want).c_str(), static_cast<unsigned long long>(seed),
                      static_cast<unsigned long long>(dynemb::emulation::lane_order_seed()));
          return 1;
        }
        checked += want.find >= 0;
      }
    }
  }
  for (const std::string& diff : {lanes_init_difference(), lanes_move_difference<float>("float"),
                                   lanes_move_difference<c10::Half>("half")}) {
    if (!diff.empty()) {
      std::printf("%s\n", diff.c_str());
      return 1;
    }
  }
  if (checked == 0) {
    std::printf("no query found its key: the test checks nothing\n");
    return 1;
  }
  std::printf("ok\n");
  return 0;
}
