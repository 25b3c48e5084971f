// dynemb emulated CUDA executor: the grid runner of cuda_shim.h.
#include <pthread.h>

#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "emulated/cuda_shim.h"

thread_local dim3 blockIdx;
thread_local dim3 threadIdx;
thread_local dim3 blockDim;
thread_local dim3 gridDim;

namespace dynemb::emulation {
namespace {

/// At least 4 OS threads, so that emulated blocks interleave even on 2 cores.
int pool_size() { return std::max(4, static_cast<int>(std::thread::hardware_concurrency())); }

uint64_t read_seed() {
  if (const char* text = std::getenv("DYNEMB_EMULATION_SEED"); text != nullptr && *text != '\0') {
    char* end = nullptr;
    const unsigned long long seed = std::strtoull(text, &end, 10);
    if (*end == '\0') return seed;
    throw std::runtime_error(std::string("DYNEMB_EMULATION_SEED must be a decimal integer, got '") +
                             text + "'");
  }
  return std::random_device{}();
}

/// A persistent pool; one grid at a time (launches from several host threads queue,
/// as launches on one stream do). A unit of work is a block.
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

  /// `number`: the launch's number in this process (launch_count before it).
  void run(unsigned grid, unsigned block, const char* kernel, uint64_t number,
           const std::function<void()>& thread) {
    std::lock_guard<std::mutex> one_grid(launch_mutex_);
    const LaunchInfo launch{kernel, number, lane_order_seed()};
    Job job{grid, block, &thread, &launch};
    if (grid <= 1 || workers_.empty()) {  // one block: nothing to race with
      run_blocks(job);
    } else {
      std::atomic<uint64_t> next{0};
      job.next = &next;
      {
        std::lock_guard<std::mutex> lock(mutex_);
        job_ = job;
        busy_ = static_cast<int>(workers_.size());
        ++generation_;
      }
      wake_.notify_all();
      run_blocks(job);
      std::unique_lock<std::mutex> lock(mutex_);
      done_.wait(lock, [this] { return busy_ == 0; });
    }
    memory::acquire(&launch);  // every thread of the grid released it as it exited
    if (job_error_) {
      std::exception_ptr error = job_error_;
      job_error_ = nullptr;
      std::rethrow_exception(error);
    }
  }

 private:
  struct Job {
    unsigned grid = 0, block = 0;
    const std::function<void()>* thread = nullptr;
    const LaunchInfo* launch = nullptr;
    std::atomic<uint64_t>* next = nullptr;  // null: the caller runs every block
  };

  void run_blocks(const Job& job) {
    {
      memory::RuntimeScope runtime;  // the last grid's threads read them, unordered
      gridDim = dim3(job.grid);
      blockDim = dim3(job.block);
    }
    for (uint64_t b = job.next ? job.next->fetch_add(1) : 0; b < job.grid;
         b = job.next ? job.next->fetch_add(1) : b + 1) {
      try {
        run_block(*job.launch, static_cast<unsigned>(b), job.block, *job.thread);
      } catch (...) {
        std::lock_guard<std::mutex> lock(error_mutex_);
        if (!job_error_) job_error_ = std::current_exception();
        if (job.next) job.next->store(job.grid);  // the other workers stop taking blocks
        return;
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
      run_blocks(job);
      {
        std::lock_guard<std::mutex> lock(mutex_);
        --busy_;
      }
      done_.notify_one();
    }
  }

  std::mutex launch_mutex_;
  std::mutex mutex_, error_mutex_;
  std::condition_variable wake_, done_;
  std::vector<std::thread> workers_;
  Job job_;
  std::exception_ptr job_error_;
  uint64_t generation_ = 0;
  int busy_ = 0;
  bool stopping_ = false;
};

// launch_count numbers the launches too (LaunchInfo::number): one count serves both.
std::atomic<uint64_t> launch_count{0}, memset_count{0}, block_count{0}, thread_count{0},
    host_read_count{0};

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

uint64_t lane_order_seed() {
  static const uint64_t seed = read_seed();
  return seed;
}

void count_memset() { memset_count.fetch_add(1, std::memory_order_relaxed); }
void count_host_read() { host_read_count.fetch_add(1, std::memory_order_relaxed); }

Counters counters() {
  return {launch_count.load(), memset_count.load(), block_count.load(), thread_count.load(),
          host_read_count.load()};
}

void run_grid(unsigned grid, unsigned block, const char* kernel, const std::function<void()>& thread) {
  const uint64_t number = launch_count.fetch_add(1, std::memory_order_relaxed);
  block_count.fetch_add(grid, std::memory_order_relaxed);
  thread_count.fetch_add(uint64_t{grid} * block, std::memory_order_relaxed);
  if (grid == 0 || block == 0) return;
  pool().run(grid, block, kernel, number, thread);
}

void spin_pause() { lane_yield(); }

bool injected_fault(const char* kernel) {
  static const std::string fault = [] {
    const char* v = std::getenv("DYNEMB_EMULATION_FAULT_KERNEL");
    return std::string(v != nullptr ? v : "");
  }();
  return !fault.empty() && std::strstr(kernel, fault.c_str()) != nullptr;
}

void misaligned(const void* p, unsigned bytes, const char* access, std::source_location where) {
  char text[256];
  const char* file = std::strrchr(where.file_name(), '/');
  std::snprintf(text, sizeof text,
                "misaligned address: %s of %u bytes at %p, called at %s:%u (a GPU faults: "
                "cudaErrorMisalignedAddress)",
                access, bytes, p, file ? file + 1 : where.file_name(), where.line());
  lane_fault(text);
}

}  // namespace dynemb::emulation
