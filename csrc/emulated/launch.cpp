// dynemb emulated CUDA executor: the grid runner of cuda_shim.h.
#include <pthread.h>

#include <algorithm>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

#include "emulated/cuda_shim.h"

thread_local dim3 blockIdx;
thread_local dim3 threadIdx;
thread_local dim3 blockDim;
thread_local dim3 gridDim;

namespace dynemb::emulation {
namespace {

constexpr unsigned kWarp = 32;

/// At least 4 OS threads, so that emulated threads interleave even on 2 cores.
int pool_size() { return std::max(4, static_cast<int>(std::thread::hardware_concurrency())); }

/// A persistent pool; one grid at a time (launches from several host threads queue,
/// as launches on one stream do).
class GridPool {
 public:
  GridPool() {
    for (int w = 1; w < pool_size(); ++w) workers_.emplace_back([this] { serve(); });
  }
  ~GridPool() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_all();
    for (std::thread& w : workers_) w.join();
  }

  void run(unsigned grid, unsigned block, const std::function<void()>& thread) {
    std::lock_guard<std::mutex> one_grid(launch_mutex_);
    const uint64_t warps_per_block = (block + kWarp - 1) / kWarp;
    const uint64_t units = static_cast<uint64_t>(grid) * warps_per_block;
    if (units <= 1 || workers_.empty()) {  // one warp: nothing to race with
      run_units(grid, block, thread, units, nullptr);
      return;
    }
    std::atomic<uint64_t> next{0};
    {
      std::lock_guard<std::mutex> lock(mutex_);
      job_ = Job{grid, block, &thread, units, &next};
      busy_ = static_cast<int>(workers_.size());
      ++generation_;
    }
    wake_.notify_all();
    run_units(grid, block, thread, units, &next);
    std::unique_lock<std::mutex> lock(mutex_);
    done_.wait(lock, [this] { return busy_ == 0; });
  }

 private:
  struct Job {
    unsigned grid = 0, block = 0;
    const std::function<void()>* thread = nullptr;
    uint64_t units = 0;
    std::atomic<uint64_t>* next = nullptr;
  };

  static void run_units(unsigned grid, unsigned block, const std::function<void()>& thread,
                        uint64_t units, std::atomic<uint64_t>* next) {
    gridDim = dim3(grid);
    blockDim = dim3(block);
    const uint64_t warps_per_block = (block + kWarp - 1) / kWarp;
    for (uint64_t u = next ? next->fetch_add(1) : 0; u < units;
         u = next ? next->fetch_add(1) : u + 1) {
      blockIdx = dim3(static_cast<unsigned>(u / warps_per_block));
      const unsigned first = static_cast<unsigned>(u % warps_per_block) * kWarp;
      const unsigned last = std::min(block, first + kWarp);
      for (unsigned t = first; t < last; ++t) {
        threadIdx = dim3(t);
        thread();
      }
    }
  }

  void serve() {
    uint64_t seen = 0;
    for (;;) {
      Job job;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        wake_.wait(lock, [&] { return stopping_ || generation_ != seen; });
        if (stopping_) return;
        seen = generation_;
        job = job_;
      }
      run_units(job.grid, job.block, *job.thread, job.units, job.next);
      {
        std::lock_guard<std::mutex> lock(mutex_);
        --busy_;
      }
      done_.notify_one();
    }
  }

  std::mutex launch_mutex_;
  std::mutex mutex_;
  std::condition_variable wake_, done_;
  std::vector<std::thread> workers_;
  Job job_;
  uint64_t generation_ = 0;
  int busy_ = 0;
  bool stopping_ = false;
};

GridPool* the_pool = nullptr;  // never destroyed: workers may outlive statics
std::once_flag fork_handler;

GridPool& pool() {
  // A forked child has none of the parent's workers: it starts a pool of its own.
  std::call_once(fork_handler, [] { pthread_atfork(nullptr, nullptr, [] { the_pool = nullptr; }); });
  static std::mutex creating;
  std::lock_guard<std::mutex> lock(creating);
  if (the_pool == nullptr) the_pool = new GridPool();
  return *the_pool;
}

}  // namespace

void run_grid(unsigned grid, unsigned block, const std::function<void()>& thread) {
  if (grid == 0 || block == 0) return;
  pool().run(grid, block, thread);
}

void spin_pause() { std::this_thread::yield(); }

}  // namespace dynemb::emulation
