// dynemb torch layer: memory placement of host table buffers.
//
// A hash table touches random rows of buffers that reach gigabytes; with 4 KiB
// pages nearly every access also misses the TLB. Asking for transparent huge
// pages (2 MiB) before the buffer is first touched removes most of those misses
// where the kernel runs THP in "madvise" mode (the common default).
#include <ATen/ATen.h>
#include <sys/mman.h>
#include <torch/library.h>

#include <cstdint>

namespace dynemb {
namespace {

bool advise_huge_pages_cpu(const at::Tensor& buffer) {
  constexpr uintptr_t kHuge = uintptr_t{2} << 20;
  const auto begin = reinterpret_cast<uintptr_t>(buffer.data_ptr());
  const uintptr_t first = (begin + kHuge - 1) & ~(kHuge - 1);
  const uintptr_t last = (begin + buffer.nbytes()) & ~(kHuge - 1);
  if (last <= first) return false;
  return madvise(reinterpret_cast<void*>(first), last - first, MADV_HUGEPAGE) == 0;
}

}  // namespace

TORCH_LIBRARY_IMPL(dynemb, CPU, m) { m.impl("advise_huge_pages", &advise_huge_pages_cpu); }

}  // namespace dynemb
