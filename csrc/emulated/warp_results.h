// dynemb emulated CUDA executor: the results of a warp collective (warp_results.cpp),
// computed once every lane of its mask has arrived (lockstep.cpp).
#pragma once

#include <cstdint>

#include "emulated/lockstep.h"

namespace dynemb::emulation {

/// The source lane of a shuffle (PTX shfl.sync: segmask and the clamp from the width),
/// or the lane itself where PTX copies the lane's own value.
unsigned shuffle_source(const CollectiveCall& call, unsigned lane);

/// Fills results[lane] for every lane of call.mask, from calls[lane] (each lane's own
/// call: a shuffle's source may differ per lane). @return -1, or the first lane whose
/// shuffle reads a lane outside the mask (CUDA leaves that value undefined: an error).
int warp_results(const CollectiveCall& call, const CollectiveCall* calls, uint64_t* results);

}  // namespace dynemb::emulation
