// dynemb emulated CUDA executor: __threadfence's release and acquire patterns for
// ThreadSanitizer (memory_model.h). Called by the shim's atomics and fences in TSan
// builds only.
#include "emulated/memory_model.h"

#include <algorithm>

namespace dynemb::emulation::memory {

namespace {

/// How far back a lane's list of read addresses is searched for a repeat (a spin loop
/// reads one address many times; a lane reading thousands without a fence is rare).
constexpr size_t kRecentReads = 16;

}  // namespace

void note_atomic_write(const void* p) {
  RuntimeScope runtime;
  const LaneFences* lane = current_lane_fences();
  if (lane != nullptr && lane->fenced) release(p);  // a fence, then this write
}

void note_atomic_read(const void* p) {
  RuntimeScope runtime;
  LaneFences* lane = current_lane_fences();
  if (lane == nullptr) return;
  std::vector<const void*>& reads = lane->reads;
  const auto recent = static_cast<std::ptrdiff_t>(std::min(reads.size(), kRecentReads));
  if (std::find(reads.end() - recent, reads.end(), p) == reads.end()) reads.push_back(p);
}

void note_fence() {
  RuntimeScope runtime;
  LaneFences* lane = current_lane_fences();
  if (lane == nullptr) return;
  for (const void* p : lane->reads) acquire(p);  // these reads, then this fence
  lane->reads.clear();
  lane->fenced = true;
}

}  // namespace dynemb::emulation::memory
