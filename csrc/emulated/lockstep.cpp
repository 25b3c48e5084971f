// dynemb emulated CUDA executor: the lockstep block runner of lockstep.h.
#include "emulated/lockstep.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "emulated/cuda_shim.h"
#include "emulated/fiber.h"
#include "emulated/lockstep_rules.h"
#include "emulated/memory_model.h"

namespace dynemb::emulation {

namespace {

constexpr unsigned kWarp = 32;
// Kernels keep rows and a few indices on their stacks; ASan's redzones need more.
constexpr size_t kFiberStack = 256 * 1024;

std::string hex(unsigned mask) {
  char text[16];
  std::snprintf(text, sizeof text, "0x%08x", mask);
  return text;
}

std::string site(std::source_location where) {
  const char* file = where.file_name();
  const char* slash = std::strrchr(file, '/');
  return std::string(slash ? slash + 1 : file) + ":" + std::to_string(where.line());
}

enum class LaneState : uint8_t { kReady, kAtWarp, kAtBarrier, kAtActiveMask, kExited };

struct Lane {
  Fiber* fiber = nullptr;  // from the first run to the exit; then back to the free list
  LaneState state = LaneState::kReady;
  CollectiveCall call{Collective::kSyncWarp, 0, 0};
  std::source_location where;
  uint64_t result = 0;
  unsigned rank = 0;  // the lane's place in this block's drawn order
  memory::LaneFences fences;
};

/// One per OS thread: runs the blocks that thread takes, one at a time.
class BlockRunner {
 public:
  void run(const LaunchInfo& launch, unsigned block_index, unsigned block_size,
           const std::function<void()>& thread);

  bool in_lane() const { return current_ != kNone; }
  uint64_t collective(const CollectiveCall& call, std::source_location where);
  void barrier(std::source_location where);
  unsigned active_mask();
  void yield();
  [[noreturn]] void fault(const std::string& what);
  memory::LaneFences& fences() { return lanes_[current_].fences; }

 private:
  static constexpr unsigned kNone = ~0u;
  static void lane_main(void* runner);
  Fiber* take_fiber(unsigned t);
  const void* warp_sync(unsigned warp, unsigned mask);

  void push_ready(unsigned t) { ready_.push_back(t); }
  void release_in_order(std::vector<unsigned>& lanes);
  void try_complete_warp(unsigned t);
  void try_complete_barrier();
  bool release_active_masks();
  void compute_results(unsigned warp, const CollectiveCall& call);
  std::string call_error(const CollectiveCall& call, std::source_location where) const;
  [[noreturn]] void abandon_lane();
  [[noreturn]] void fail(const std::string& what);
  std::string stall_report() const;
  std::string describe_wait(unsigned t) const;

  std::vector<Lane> lanes_;
  // Stacks: a lane takes one when it first runs and gives it back when it exits, so a
  // block whose threads never wait runs them all on one stack that stays in cache.
  std::vector<std::unique_ptr<Fiber>> fibers_;
  std::vector<Fiber*> free_fibers_;
  std::vector<unsigned> order_;
  std::vector<unsigned> ready_;  // a FIFO: ready_[head_ ..)
  size_t head_ = 0;
  unsigned block_size_ = 0, block_index_ = 0;
  unsigned at_barrier_ = 0, exited_ = 0;
  unsigned current_ = kNone;
  const LaunchInfo* launch_ = nullptr;
  const std::function<void()>* thread_ = nullptr;
  std::string lane_error_;

  // ThreadSanitizer's sync objects (memory_model.h), used by address only. A collective
  // instance's lanes release at arrival and acquire at departure; instances alternate
  // between two objects, so a lane that runs on to the next instance before a partner
  // of this one departed releases into the other (it cannot reach the one after next
  // without that partner). Blocks of this OS thread alternate the same way.
  struct WarpSync {
    uint64_t done = 0;  // completed __syncwarp instances of this (warp, mask)
    uint64_t object[2] = {};
  };
  std::map<std::pair<unsigned, unsigned>, WarpSync> warp_syncs_;
  uint64_t barriers_done_ = 0, barrier_object_[2] = {};
  uint64_t blocks_run_ = 0, block_exits_[2] = {}, block_start_ = 0;
};

thread_local BlockRunner runner;

// Entered with TSan ignoring accesses (fiber.h), which the kernel's own code must not be.
void BlockRunner::lane_main(void* self) {
  auto* r = static_cast<BlockRunner*>(self);
  const unsigned t = r->current_;
  r->lanes_[t].fences.clear();
  // The launch, and the blocks this OS thread ran before, happen before this thread.
  memory::acquire(&r->block_start_);
  memory::acquire(&r->block_exits_[(r->blocks_run_ + 1) % 2]);
  const std::function<void()>& thread = *r->thread_;
  memory::ignore_end();
  thread();
  memory::ignore_begin();
  memory::release(&r->block_exits_[r->blocks_run_ % 2]);
  memory::release(r->launch_);
  r->lanes_[t].state = LaneState::kExited;
}

Fiber* BlockRunner::take_fiber(unsigned t) {
  if constexpr (memory::kTracked) {
    // Under TSan each thread of a block has its own stack: a stack another thread of the
    // block left would hold that thread's accesses, unordered with this one's.
    while (fibers_.size() <= t) fibers_.push_back(std::make_unique<Fiber>(kFiberStack));
    return fibers_[t].get();
  }
  if (free_fibers_.empty()) {
    fibers_.push_back(std::make_unique<Fiber>(kFiberStack));
    return fibers_.back().get();
  }
  Fiber* fiber = free_fibers_.back();
  free_fibers_.pop_back();
  return fiber;
}

void BlockRunner::run(const LaunchInfo& launch, unsigned block_index, unsigned block_size,
                      const std::function<void()>& thread) {
  if (lanes_.size() < block_size) lanes_.resize(block_size);
  free_fibers_.clear();  // every stack is free at a block's start (even after an error)
  for (const auto& fiber : fibers_) free_fibers_.push_back(fiber.get());
  launch_ = &launch;
  thread_ = &thread;
  ++blocks_run_;
  memory::release(&block_start_);
  block_index_ = block_index;
  block_size_ = block_size;
  at_barrier_ = exited_ = 0;
  lane_error_.clear();
  std::vector<unsigned>& order = order_;
  draw_lane_order(launch.seed, launch.number, block_index, block_size, order);
  ready_.clear();
  head_ = 0;
  for (unsigned k = 0; k < block_size; ++k) {
    Lane& lane = lanes_[order[k]];
    lane.state = LaneState::kReady;
    lane.rank = k;
    lane.fiber = nullptr;
    push_ready(order[k]);
  }
  while (exited_ < block_size_) {
    if (head_ == ready_.size() && !release_active_masks()) fail(stall_report());
    const unsigned t = ready_[head_++];
    current_ = t;
    {
      memory::RuntimeScope runtime;  // the lanes read it, unordered with this write
      threadIdx = dim3(t);
    }
    if (lanes_[t].fiber == nullptr) {
      lanes_[t].fiber = take_fiber(t);
      lanes_[t].fiber->reset(&BlockRunner::lane_main, this);
    }
    lanes_[t].fiber->resume();
    current_ = kNone;
    if (!lane_error_.empty()) fail(lane_error_);
    switch (lanes_[t].state) {
      case LaneState::kExited:
        if constexpr (!memory::kTracked) free_fibers_.push_back(lanes_[t].fiber);
        ++exited_;
        if (at_barrier_ > 0) fail(stall_report());
        break;
      case LaneState::kAtWarp: try_complete_warp(t); break;
      case LaneState::kAtActiveMask: break;  // released when no lane can run
      case LaneState::kAtBarrier:
        ++at_barrier_;
        try_complete_barrier();
        break;
      case LaneState::kReady:  // yielded in a spin loop
        if (head_ == ready_.size()) std::this_thread::yield();
        push_ready(t);
        break;
    }
    if (head_ > 4096 && head_ * 2 > ready_.size()) {  // keep the FIFO small
      ready_.erase(ready_.begin(), ready_.begin() + static_cast<std::ptrdiff_t>(head_));
      head_ = 0;
    }
  }
}

void BlockRunner::release_in_order(std::vector<unsigned>& lanes) {
  std::sort(lanes.begin(), lanes.end(),
            [this](unsigned a, unsigned b) { return lanes_[a].rank < lanes_[b].rank; });
  for (unsigned t : lanes) {
    lanes_[t].state = LaneState::kReady;
    push_ready(t);
  }
}

void BlockRunner::try_complete_warp(unsigned t) {
  const CollectiveCall& call = lanes_[t].call;
  const unsigned warp = t / kWarp;
  for (unsigned bit = 0; bit < kWarp; ++bit) {
    if (!(call.mask >> bit & 1u)) continue;
    const Lane& other = lanes_[warp * kWarp + bit];
    if (other.state != LaneState::kAtWarp) return;  // not there yet (or never: a stall)
    if (other.call.kind != call.kind || other.call.mask != call.mask ||
        other.call.width != call.width) {
      return;  // another collective: the stall report says which
    }
  }
  compute_results(warp, call);
  if (memory::kTracked && call.kind == Collective::kSyncWarp) {
    ++warp_syncs_[{warp, call.mask}].done;
  }
  std::vector<unsigned> members;
  for (unsigned bit = 0; bit < kWarp; ++bit) {
    if (call.mask >> bit & 1u) members.push_back(warp * kWarp + bit);
  }
  release_in_order(members);
}

void BlockRunner::try_complete_barrier() {
  if (at_barrier_ + exited_ < block_size_) return;
  if (exited_ > 0) fail(stall_report());
  std::vector<unsigned> all;
  for (unsigned t = 0; t < block_size_; ++t) {
    if (lanes_[t].where.line() != lanes_[0].where.line() ||
        std::strcmp(lanes_[t].where.file_name(), lanes_[0].where.file_name()) != 0) {
      fail("__syncthreads reached at different call sites: thread 0 at " + site(lanes_[0].where) +
           ", thread " + std::to_string(t) + " at " + site(lanes_[t].where) +
           " (a barrier inside divergent code)");
    }
    all.push_back(t);
  }
  at_barrier_ = 0;
  ++barriers_done_;
  release_in_order(all);
}

void BlockRunner::compute_results(unsigned warp, const CollectiveCall& call) {
  Lane* lanes = &lanes_[warp * kWarp];
  CollectiveCall calls[kWarp];
  uint64_t results[kWarp] = {};
  for (unsigned bit = 0; bit < kWarp; ++bit) calls[bit] = lanes[bit].call;
  const int bad = warp_results(call, calls, results);
  if (bad >= 0) {
    const Lane& lane = lanes[bad];
    fail(std::string(collective_name(call.kind)) + " at " + site(lane.where) + ": lane " +
         std::to_string(bad) + " of warp " + std::to_string(warp) + " reads lane " +
         std::to_string(shuffle_source(lane.call, bad)) + ", which mask " + hex(call.mask) +
         " leaves out (CUDA leaves the value undefined)");
  }
  for (unsigned bit = 0; bit < kWarp; ++bit) {
    if (call.mask >> bit & 1u) lanes[bit].result = results[bit];
  }
}

std::string BlockRunner::call_error(const CollectiveCall& call, std::source_location where) const {
  const unsigned t = current_;
  const unsigned lane_bit = t % kWarp;
  const std::string name = collective_name(call.kind);
  if (!(call.mask >> lane_bit & 1u)) {
    return name + " at " + site(where) + ": lane " + std::to_string(lane_bit) + " of warp " +
           std::to_string(t / kWarp) + " calls it with mask " + hex(call.mask) +
           ", which leaves the lane itself out";
  }
  const unsigned lanes_here = std::min(kWarp, block_size_ - (t - lane_bit));
  if (lanes_here < kWarp && (call.mask >> lanes_here) != 0) {
    return name + " at " + site(where) + ": mask " + hex(call.mask) + " names lanes beyond the " +
           std::to_string(lanes_here) + " threads of warp " + std::to_string(t / kWarp) +
           " (block of " + std::to_string(block_size_) + ")";
  }
  const bool shuffle = call.kind == Collective::kShflIdx || call.kind == Collective::kShflUp ||
                       call.kind == Collective::kShflDown || call.kind == Collective::kShflXor;
  if (shuffle && (call.width < 1 || call.width > 32 || (call.width & (call.width - 1)) != 0)) {
    return name + " at " + site(where) + ": width " + std::to_string(call.width) +
           " is not a power of two in [1, 32]";
  }
  return {};
}

uint64_t BlockRunner::collective(const CollectiveCall& call, std::source_location where) {
  lane_error_ = call_error(call, where);
  if (!lane_error_.empty()) abandon_lane();
  Lane& lane = lanes_[current_];
  lane.call = call;
  lane.where = where;
  lane.state = LaneState::kAtWarp;
  // Of the collectives only __syncwarp orders memory (memory_model.h).
  const void* sync =
      call.kind == Collective::kSyncWarp ? warp_sync(current_ / kWarp, call.mask) : nullptr;
  if (sync != nullptr) memory::release(sync);
  lane.fiber->suspend();
  if (sync != nullptr) memory::acquire(sync);
  return lane.result;
}

const void* BlockRunner::warp_sync(unsigned warp, unsigned mask) {
  if constexpr (!memory::kTracked) return nullptr;
  WarpSync& sync = warp_syncs_[{warp, mask}];
  return &sync.object[sync.done % 2];
}

void BlockRunner::barrier(std::source_location where) {
  Lane& lane = lanes_[current_];
  lane.where = where;
  lane.state = LaneState::kAtBarrier;
  const void* sync = &barrier_object_[barriers_done_ % 2];
  memory::release(sync);
  lane.fiber->suspend();
  memory::acquire(sync);
}

unsigned BlockRunner::active_mask() {
  Lane& lane = lanes_[current_];
  lane.state = LaneState::kAtActiveMask;
  lane.fiber->suspend();
  return static_cast<unsigned>(lane.result);
}

/// __activemask(): once no thread of the block can run, the lanes of each warp that
/// wait at __activemask are the ones that reached it together; each gets that set.
bool BlockRunner::release_active_masks() {
  std::vector<unsigned> released;
  for (unsigned first = 0; first < block_size_; first += kWarp) {
    unsigned mask = 0;
    for (unsigned bit = 0; bit < kWarp && first + bit < block_size_; ++bit) {
      if (lanes_[first + bit].state == LaneState::kAtActiveMask) mask |= 1u << bit;
    }
    for (unsigned bit = 0; bit < kWarp; ++bit) {
      if (!(mask >> bit & 1u)) continue;
      lanes_[first + bit].result = mask;
      released.push_back(first + bit);
    }
  }
  release_in_order(released);
  return !released.empty();
}

void BlockRunner::yield() {
  lanes_[current_].state = LaneState::kReady;
  lanes_[current_].fiber->suspend();
}

void BlockRunner::fault(const std::string& what) {
  lane_error_ = what;
  abandon_lane();
}

void BlockRunner::abandon_lane() {
  // No object of this frame owns memory: the fiber is never resumed (run() raises
  // lane_error_), so nothing here would be freed.
  lanes_[current_].fiber->suspend();
  __builtin_trap();
}

void BlockRunner::fail(const std::string& what) {
  current_ = kNone;
  if constexpr (memory::kTracked) {
    // The threads left inside the kernel never exit: what they did happens before what
    // this OS thread runs next (their stacks, the launch's error, the next launch).
    for (unsigned t = 0; t < block_size_; ++t) {
      const Lane& lane = lanes_[t];
      if (lane.fiber != nullptr && lane.state != LaneState::kExited) lane.fiber->adopt();
    }
  }
  throw std::runtime_error("dynemb emulation: kernel " + std::string(launch_->kernel) + ", block " +
                           std::to_string(block_index_) + ": " + what + " (DYNEMB_EMULATION_SEED=" +
                           std::to_string(launch_->seed) + " replays this lane order)");
}

std::string BlockRunner::describe_wait(unsigned t) const {
  const Lane& lane = lanes_[t];
  switch (lane.state) {
    case LaneState::kExited: return "it exited";
    case LaneState::kAtBarrier: return "it waits at __syncthreads at " + site(lane.where);
    case LaneState::kAtWarp:
      return std::string("it waits at ") + collective_name(lane.call.kind) + " (mask " +
             hex(lane.call.mask) + ") at " + site(lane.where);
    case LaneState::kAtActiveMask: return "it waits at __activemask";
    case LaneState::kReady: break;
  }
  return "it is ready";
}

std::string BlockRunner::stall_report() const {
  // A warp collective that some lane of its mask cannot reach.
  for (unsigned t = 0; t < block_size_; ++t) {
    const Lane& lane = lanes_[t];
    if (lane.state != LaneState::kAtWarp) continue;
    const unsigned warp_first = t - t % kWarp;
    for (unsigned bit = 0; bit < kWarp; ++bit) {
      if (!(lane.call.mask >> bit & 1u)) continue;
      const Lane& other = lanes_[warp_first + bit];
      const bool same = other.state == LaneState::kAtWarp && other.call.kind == lane.call.kind &&
                        other.call.mask == lane.call.mask && other.call.width == lane.call.width;
      if (!same) {
        return "lane " + std::to_string(bit) + " of warp " + std::to_string(t / kWarp) +
               " never reaches " + collective_name(lane.call.kind) + " (mask " +
               hex(lane.call.mask) + ") at " + site(lane.where) + " where lane " +
               std::to_string(t % kWarp) + " waits: " + describe_wait(warp_first + bit);
      }
    }
  }
  // A barrier that some thread skips.
  for (unsigned t = 0; t < block_size_; ++t) {
    if (lanes_[t].state != LaneState::kAtBarrier) continue;
    for (unsigned other = 0; other < block_size_; ++other) {
      if (lanes_[other].state == LaneState::kAtBarrier) continue;
      return "thread " + std::to_string(other) + " never reaches __syncthreads at " +
             site(lanes_[t].where) + " where thread " + std::to_string(t) +
             " waits: " + describe_wait(other) + " (a barrier inside divergent code)";
    }
  }
  return "no thread can run, none waits at a collective";
}

}  // namespace

uint64_t warp_collective(const CollectiveCall& call, std::source_location where) {
  memory::RuntimeScope runtime;
  if (!runner.in_lane()) {
    throw std::runtime_error(std::string("dynemb emulation: ") + collective_name(call.kind) +
                             " called outside a kernel");
  }
  return runner.collective(call, where);
}

void block_barrier(std::source_location where) {
  memory::RuntimeScope runtime;
  if (!runner.in_lane()) throw std::runtime_error("dynemb emulation: __syncthreads outside a kernel");
  runner.barrier(where);
}

unsigned active_lanes() {
  memory::RuntimeScope runtime;
  return runner.in_lane() ? runner.active_mask() : 0u;
}

void lane_yield() {
  memory::RuntimeScope runtime;
  if (runner.in_lane()) {
    runner.yield();
  } else {
    std::this_thread::yield();
  }
}

void run_block(const LaunchInfo& launch, unsigned block_index, unsigned block_size,
               const std::function<void()>& thread) {
  {
    memory::RuntimeScope runtime;  // the previous block's threads read it, unordered
    blockIdx = dim3(block_index);
  }
  runner.run(launch, block_index, block_size, thread);
}

void lane_fault(const std::string& what) {
  memory::RuntimeScope runtime;
  if (!runner.in_lane()) throw std::runtime_error("dynemb emulation: " + what);
  runner.fault(what);
}

namespace memory {

LaneFences* current_lane_fences() { return runner.in_lane() ? &runner.fences() : nullptr; }

}  // namespace memory

}  // namespace dynemb::emulation
