// dynemb emulated CUDA executor: the rules of a lockstep block that need no runner state
// (lockstep_rules.cpp, used by lockstep.cpp).
#pragma once

#include <cstdint>
#include <vector>

#include "emulated/lockstep.h"

namespace dynemb::emulation {

/// The order in which a block's threads first run (and are released from collectives):
/// a permutation of [0, block_size) drawn from (seed, launch number, block index).
void draw_lane_order(uint64_t seed, uint64_t launch, unsigned block, unsigned block_size,
                     std::vector<unsigned>& order);

/// The source lane of a shuffle (PTX shfl.sync: segmask and the clamp from the width),
/// or the lane itself where PTX copies the lane's own value.
unsigned shuffle_source(const CollectiveCall& call, unsigned lane);

/// Fills results[lane] for every lane of call.mask, from calls[lane] (each lane's own
/// call: a shuffle's source may differ per lane). @return -1, or the first lane whose
/// shuffle reads a lane outside the mask (CUDA leaves that value undefined: an error).
int warp_results(const CollectiveCall& call, const CollectiveCall* calls, uint64_t* results);

}  // namespace dynemb::emulation
