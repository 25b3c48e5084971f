// dynemb emulated CUDA executor: fibers, the stackful coroutines that the lanes of an
// emulated block run on (lockstep.cpp), so that a lane can stop at a warp collective or
// a block barrier and resume there once its partners have arrived.
//
// A Fiber owns a stack (mmap'd, with a guard page below it) and switches with a few
// instructions on x86-64 (the callee-saved registers and the stack pointer; the
// fibers of an OS thread share its floating-point control words) and with
// <ucontext.h> elsewhere. The switches are announced to
// AddressSanitizer and ThreadSanitizer, which otherwise take a fiber's stack for a
// corrupted thread stack. To ThreadSanitizer a fiber is a thread of its own, and a
// switch does not order it with the scheduler (memory_model.h says what does); its
// entries run with TSan ignoring their memory accesses, the fiber's bookkeeping being
// shared with the scheduler: an entry ends the ignore around the program's own code.
#pragma once

#include <cstddef>

namespace dynemb::emulation {

class Fiber {
 public:
  using Entry = void (*)(void* arg);

  explicit Fiber(size_t stack_bytes);
  ~Fiber();
  Fiber(const Fiber&) = delete;
  Fiber& operator=(const Fiber&) = delete;

  /// Makes the next resume() run entry(arg): after the last entry returned, or from the
  /// top of a clean stack when the fiber is new or was left inside an entry.
  void reset(Entry entry, void* arg);

  /// Runs this fiber from the calling (scheduler) context until it calls suspend() or
  /// its entry returns. Only one fiber runs at a time per OS thread.
  void resume();

  /// From inside the fiber: back to the scheduler; the next resume() continues here.
  void suspend();

  /// ThreadSanitizer: everything the fiber did happens before the caller's next step.
  /// For a fiber left inside an entry (an error), whose history no exit will publish.
  void adopt();

  struct Context;  // the saved registers or ucontext, and the sanitizers' fiber state
  [[noreturn]] static void run_entries(Context* c);

 private:
  void switch_out();

  void* stack_ = nullptr;  // the mapping, guard page included
  size_t mapped_bytes_ = 0;
  Context* context_ = nullptr;
};

}  // namespace dynemb::emulation
