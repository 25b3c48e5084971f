// dynemb emulated CUDA executor: the fibers of fiber.h.
#include "emulated/fiber.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <new>
#include <stdexcept>
#include <string>

#include "emulated/memory_model.h"

#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define DYNEMB_FIBER_ASAN 1
#endif
#if __has_feature(thread_sanitizer)
#define DYNEMB_FIBER_TSAN 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__)
#define DYNEMB_FIBER_ASAN 1
#endif
#if defined(__SANITIZE_THREAD__)
#define DYNEMB_FIBER_TSAN 1
#endif

#if defined(DYNEMB_FIBER_ASAN)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif
#if defined(DYNEMB_FIBER_TSAN)
#include <sanitizer/tsan_interface.h>
#endif

#if defined(__x86_64__)
// dynemb_fiber_switch(save, next): pushes the callee-saved registers on the current
// stack, stores the stack pointer in *save, and pops the same from next. The SSE and
// x87 control words are not switched (saving them was most of a switch's cost): every
// fiber of an OS thread shares them, and no kernel changes them. dynemb_fiber_start is where a fresh stack "returns" to: it calls
// r13(r12) (dynemb_fiber_enter(context)), which never returns.
extern "C" void dynemb_fiber_switch(void** save, void* next);
extern "C" void dynemb_fiber_start();
asm(R"(
  .text
  .globl dynemb_fiber_switch
  .hidden dynemb_fiber_switch
  .type dynemb_fiber_switch, @function
dynemb_fiber_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size dynemb_fiber_switch, .-dynemb_fiber_switch

  .globl dynemb_fiber_start
  .hidden dynemb_fiber_start
  .type dynemb_fiber_start, @function
dynemb_fiber_start:
  movq %r12, %rdi
  call *%r13
  ud2
  .size dynemb_fiber_start, .-dynemb_fiber_start
)");
#else
#include <ucontext.h>
#endif

namespace dynemb::emulation {

struct Fiber::Context {
  Fiber* fiber = nullptr;
  Entry entry = nullptr;
  void* arg = nullptr;
  bool parked = false;   // the last entry returned: the fiber waits in run_entries
  bool started = false;  // the stack holds frames (of a parked or an abandoned fiber)
#if defined(__x86_64__)
  void* fiber_sp = nullptr;
  void* scheduler_sp = nullptr;
#else
  ucontext_t fiber;
  ucontext_t scheduler;
#endif
#if defined(DYNEMB_FIBER_ASAN)
  void* fiber_fake_stack = nullptr;
  void* scheduler_fake_stack = nullptr;
  const void* scheduler_bottom = nullptr;
  size_t scheduler_size = 0;
#endif
#if defined(DYNEMB_FIBER_TSAN)
  void* tsan_fiber = nullptr;
  void* tsan_scheduler = nullptr;
#endif
};

namespace {

size_t page_size() { return static_cast<size_t>(sysconf(_SC_PAGESIZE)); }

}  // namespace

Fiber::Fiber(size_t stack_bytes) : context_(new Context()) {
  context_->fiber = this;
  const size_t page = page_size();
  mapped_bytes_ = (stack_bytes + page - 1) / page * page + page;  // + the guard page
  stack_ = mmap(nullptr, mapped_bytes_, PROT_READ | PROT_WRITE,
                MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK, -1, 0);
  if (stack_ == MAP_FAILED) {
    delete context_;
    throw std::runtime_error("dynemb emulation: cannot map a fiber stack of " +
                             std::to_string(mapped_bytes_) + " bytes");
  }
  mprotect(stack_, page, PROT_NONE);  // an overflow faults instead of corrupting memory
#if defined(DYNEMB_FIBER_TSAN)
  context_->tsan_fiber = __tsan_create_fiber(0);
#endif
}

Fiber::~Fiber() {
#if defined(DYNEMB_FIBER_TSAN)
  __tsan_destroy_fiber(context_->tsan_fiber);
#endif
  munmap(stack_, mapped_bytes_);
  delete context_;
}

namespace {

}  // namespace

/// The first code a fiber runs (on its own stack): the entries reset() gives it, one
/// per resume, parking in between. Entries return here, so the sanitizers see every
/// frame popped (TSan's shadow stack of a fiber whose entries never returned grew until
/// it overflowed) and the next entry needs no fresh stack.
[[noreturn]] void Fiber::run_entries(Context* c) {
  memory::ignore_begin();  // the entries end it around the program's code (fiber.h)
  for (;;) {
    c->parked = false;
    c->entry(c->arg);
    c->parked = true;
    c->fiber->switch_out();
  }
}

#if defined(__x86_64__)
// Called by dynemb_fiber_start with the Context in rdi.
extern "C" [[noreturn]] void dynemb_fiber_enter(void* context) {
  auto* c = static_cast<Fiber::Context*>(context);
#if defined(DYNEMB_FIBER_ASAN)
  __sanitizer_finish_switch_fiber(nullptr, &c->scheduler_bottom, &c->scheduler_size);
#endif
  Fiber::run_entries(c);
}
#else
static void dynemb_fiber_enter_uc(unsigned hi, unsigned lo) {
  auto* c = reinterpret_cast<Fiber::Context*>((static_cast<uintptr_t>(hi) << 32) | lo);
#if defined(DYNEMB_FIBER_ASAN)
  __sanitizer_finish_switch_fiber(nullptr, &c->scheduler_bottom, &c->scheduler_size);
#endif
  Fiber::run_entries(c);
}
#endif

void Fiber::reset(Entry entry, void* arg) {
  context_->entry = entry;
  context_->arg = arg;
  if (context_->parked) return;  // run_entries calls the new entry on the next resume
#if defined(DYNEMB_FIBER_TSAN)
  if (context_->started) {  // abandoned mid-entry: its frames stay on TSan's shadow stack
    __tsan_destroy_fiber(context_->tsan_fiber);
    context_->tsan_fiber = __tsan_create_fiber(0);
  }
#endif
  context_->started = true;
#if defined(DYNEMB_FIBER_ASAN)
  context_->fiber_fake_stack = nullptr;
  // A fiber left at an error keeps its frames' redzones: the stack starts clean again.
  __asan_unpoison_memory_region(static_cast<char*>(stack_) + page_size(), mapped_bytes_ - page_size());
#endif
  char* top = static_cast<char*>(stack_) + mapped_bytes_;
#if defined(__x86_64__)
  // The frame dynemb_fiber_switch pops: r15, r14, r13, r12, rbx, rbp and the return
  // address, placed so that the stack is 16-byte aligned at dynemb_fiber_start's call.
  auto* frame = reinterpret_cast<uint64_t*>((reinterpret_cast<uintptr_t>(top - 64) & ~uintptr_t{15}) + 8);
  frame[0] = 0;                                                // r15
  frame[1] = 0;                                                // r14
  frame[2] = reinterpret_cast<uint64_t>(&dynemb_fiber_enter);  // r13
  frame[3] = reinterpret_cast<uint64_t>(context_);             // r12
  frame[4] = 0;                                                // rbx
  frame[5] = 0;                                                // rbp
  frame[6] = reinterpret_cast<uint64_t>(&dynemb_fiber_start);  // return address
  context_->fiber_sp = frame;
#else
  getcontext(&context_->fiber);
  context_->fiber.uc_stack.ss_sp = static_cast<char*>(stack_) + page_size();
  context_->fiber.uc_stack.ss_size = mapped_bytes_ - page_size();
  context_->fiber.uc_link = nullptr;
  const auto bits = reinterpret_cast<uintptr_t>(context_);
  makecontext(&context_->fiber, reinterpret_cast<void (*)()>(&dynemb_fiber_enter_uc), 2,
              static_cast<unsigned>(bits >> 32), static_cast<unsigned>(bits & 0xffffffffu));
#endif
  (void)top;
}

void Fiber::resume() {
  Context* c = context_;
#if defined(DYNEMB_FIBER_ASAN)
  __sanitizer_start_switch_fiber(&c->scheduler_fake_stack,
                                 static_cast<char*>(stack_) + page_size(),
                                 mapped_bytes_ - page_size());
#endif
#if defined(__x86_64__)
  void* const next = c->fiber_sp;  // read before TSan takes this thread for the fiber
#endif
#if defined(DYNEMB_FIBER_TSAN)
  c->tsan_scheduler = __tsan_get_current_fiber();
  __tsan_switch_to_fiber(c->tsan_fiber, __tsan_switch_to_fiber_no_sync);
#endif
#if defined(__x86_64__)
  dynemb_fiber_switch(&c->scheduler_sp, next);
#else
  swapcontext(&c->scheduler, &c->fiber);
#endif
#if defined(DYNEMB_FIBER_ASAN)
  __sanitizer_finish_switch_fiber(c->scheduler_fake_stack, nullptr, nullptr);
#endif
}

void Fiber::switch_out() {
  Context* c = context_;
#if defined(DYNEMB_FIBER_ASAN)
  __sanitizer_start_switch_fiber(&c->fiber_fake_stack, c->scheduler_bottom, c->scheduler_size);
#endif
#if defined(__x86_64__)
  void* const next = c->scheduler_sp;  // read before TSan takes this thread for the scheduler
#endif
#if defined(DYNEMB_FIBER_TSAN)
  // Called with the fiber's accesses ignored (fiber.h); a suspended fiber holds no ignore
  // (TSan reports a thread destroyed with one).
  void* const scheduler = c->tsan_scheduler;
  memory::ignore_end();
  __tsan_switch_to_fiber(scheduler, __tsan_switch_to_fiber_no_sync);
#endif
#if defined(__x86_64__)
  dynemb_fiber_switch(&c->fiber_sp, next);
#else
  swapcontext(&c->fiber, &c->scheduler);
#endif
  memory::ignore_begin();
#if defined(DYNEMB_FIBER_ASAN)
  __sanitizer_finish_switch_fiber(c->fiber_fake_stack, &c->scheduler_bottom, &c->scheduler_size);
#endif
}

void Fiber::suspend() { switch_out(); }

void Fiber::adopt() {
#if defined(DYNEMB_FIBER_TSAN)
  // Switches that synchronise, with no stack switch between them: the fiber's history
  // is released to the caller (it runs no instrumented code meanwhile).
  void* caller = __tsan_get_current_fiber();
  __tsan_switch_to_fiber(context_->tsan_fiber, 0);
  __tsan_switch_to_fiber(caller, 0);
#endif
}

}  // namespace dynemb::emulation
