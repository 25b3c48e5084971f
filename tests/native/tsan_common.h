// The torch-free ThreadSanitizer driver's shared parts (tsan_tables.cpp): tables
// over std::vector, the checks, host threads, and the cases each file defines.
#pragma once

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
#include "cuda/launchers_quantized_cuda.h"

namespace dynemb::tsan {

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
inline float row_value(int64_t key, int64_t j) { return static_cast<float>((key * 7 + j) % 1000); }

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

inline UpsertArgs args_for(ScoreStrategy s, uint64_t batch) {
  // Each batch pins its own keys (pin numbers = batch numbers, as a table's owner does).
  return UpsertArgs{ScoreArgs{s, batch, nullptr, nullptr}, kEvictAny,
                    static_cast<uint32_t>(batch), static_cast<uint32_t>(batch)};
}

inline InitArgs uniform_init() { return InitArgs{InitMode::kUniform, -1.0f, 1.0f, 0, 0, 0, 42}; }

inline void run_threads(int n, const std::function<void(int)>& body) {
  std::vector<std::thread> threads;
  for (int t = 0; t < n; ++t) threads.emplace_back(body, t);
  for (auto& th : threads) th.join();
}


/// Key `id` of host thread `me` (each thread's keys are its own).
inline int64_t key_of(int me, int64_t id) { return (static_cast<int64_t>(me + 1) << 40) + id * 1000003; }

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


// The cases, by executor (tsan_cpu.cpp, tsan_emulated_tables.cpp,
// tsan_emulated_embedding.cpp); tsan_tables.cpp's header says what each checks.
void cpu_partitioned_upsert_erase_find();
void cpu_partitioned_evicting();
void cpu_dedup_shared_set();
void emulated_upsert_find_erase_rehash();
void emulated_restore();
void emulated_dedup();
void emulated_upsert_grouped();
void emulated_pool();
void emulated_pool_quantized();
void emulated_backward();

}  // namespace dynemb::tsan
