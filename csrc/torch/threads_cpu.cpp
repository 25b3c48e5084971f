// dynemb torch layer: how many CPU threads the ops of the calling thread use.
//
// ATen's OpenMP pool sizes each parallel region from the calling thread's own
// OpenMP setting, initialised from torch.set_num_threads on first use. A
// background thread (the prefetch of the next batch) that keeps the default opens
// a second full team beside the training thread's: on a machine with as many
// cores as one team, both then spin at barriers waiting for descheduled members.
#include <ATen/Parallel.h>
#include <omp.h>
#include <torch/library.h>

#include <cstdint>

namespace dynemb {
namespace {

/// Limits the parallel regions opened by the calling thread (dynemb's and ATen's)
/// to n threads; other threads keep theirs. @return the previous limit.
int64_t set_thread_limit(int64_t n) {
  TORCH_CHECK_VALUE(n >= 1, "dynemb.set_thread_limit: n must be >= 1, got ", n);
  const int64_t previous = at::get_num_threads();  // also runs ATen's lazy per-thread init
  omp_set_num_threads(static_cast<int>(n));
  return previous;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(dynemb, m) { m.def("set_thread_limit(int n) -> int", &set_thread_limit); }

}  // namespace dynemb
