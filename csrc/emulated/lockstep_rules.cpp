// dynemb emulated CUDA executor: the rules of a lockstep block that need no runner state
// (lockstep.cpp): the order its lanes run in, and what each lane of a warp collective
// gets back from the values its lanes passed (CUDA's documented semantics; shuffles as
// PTX shfl.sync).
#include "emulated/lockstep_rules.h"

#include <algorithm>
#include <utility>

namespace dynemb::emulation {

namespace {

constexpr unsigned kWarp = 32;

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace

void draw_lane_order(uint64_t seed, uint64_t launch, unsigned block, unsigned block_size,
                     std::vector<unsigned>& order) {
  order.resize(block_size);
  for (unsigned t = 0; t < block_size; ++t) order[t] = t;
  uint64_t state = splitmix64(seed ^ splitmix64(launch) ^ (uint64_t{block} << 32));
  for (unsigned t = block_size; t > 1; --t) {  // Fisher-Yates
    state = splitmix64(state);
    std::swap(order[t - 1], order[state % t]);
  }
}

const char* collective_name(Collective kind) {
  switch (kind) {
    case Collective::kSyncWarp: return "__syncwarp";
    case Collective::kShflIdx: return "__shfl_sync";
    case Collective::kShflUp: return "__shfl_up_sync";
    case Collective::kShflDown: return "__shfl_down_sync";
    case Collective::kShflXor: return "__shfl_xor_sync";
    case Collective::kBallot: return "__ballot_sync";
    case Collective::kAny: return "__any_sync";
    case Collective::kAll: return "__all_sync";
    case Collective::kMatchAny: return "__match_any_sync";
    case Collective::kMatchAll: return "__match_all_sync";
    case Collective::kReduceAdd: return "__reduce_add_sync";
    case Collective::kReduceMinUnsigned:
    case Collective::kReduceMinSigned: return "__reduce_min_sync";
    case Collective::kReduceMaxUnsigned:
    case Collective::kReduceMaxSigned: return "__reduce_max_sync";
    case Collective::kReduceAnd: return "__reduce_and_sync";
    case Collective::kReduceOr: return "__reduce_or_sync";
    case Collective::kReduceXor: return "__reduce_xor_sync";
  }
  return "a warp collective";
}

/// The source lane of a shuffle (PTX shfl.sync: segmask and the clamp from the width),
/// or the lane itself where PTX copies the lane's own value.
unsigned shuffle_source(const CollectiveCall& call, unsigned lane) {
  const unsigned segmask = ~static_cast<unsigned>(call.width - 1) & 0x1fu;
  const unsigned b = static_cast<unsigned>(call.arg) & 0x1fu;
  const int min_lane = static_cast<int>(lane & segmask);
  const int max_lane = static_cast<int>((lane & segmask) | (0x1fu & ~segmask));
  int j = static_cast<int>(lane);
  bool in_range = true;
  switch (call.kind) {
    case Collective::kShflIdx: j = min_lane | static_cast<int>(b & ~segmask); break;
    case Collective::kShflUp:
      j = static_cast<int>(lane) - static_cast<int>(b);
      in_range = j >= min_lane;
      break;
    case Collective::kShflDown:
      j = static_cast<int>(lane + b);
      in_range = j <= max_lane;
      break;
    case Collective::kShflXor:
      j = static_cast<int>(lane ^ b);
      in_range = j <= max_lane;
      break;
    default: break;
  }
  return in_range ? static_cast<unsigned>(j) : lane;
}

int warp_results(const CollectiveCall& call, const CollectiveCall* calls, uint64_t* results) {
  const unsigned mask = call.mask;
  auto value32 = [&](unsigned bit) { return static_cast<uint32_t>(calls[bit].value); };
  uint64_t common = 0;  // the result every lane shares, where there is one
  switch (call.kind) {
    case Collective::kBallot:
    case Collective::kAny:
    case Collective::kAll: {
      uint32_t votes = 0;
      for (unsigned bit = 0; bit < kWarp; ++bit) {
        if ((mask >> bit & 1u) && calls[bit].value != 0) votes |= 1u << bit;
      }
      common = call.kind == Collective::kBallot ? votes
               : call.kind == Collective::kAny  ? (votes != 0)
                                                : (votes == mask);
      break;
    }
    case Collective::kReduceAdd:
    case Collective::kReduceMinUnsigned:
    case Collective::kReduceMaxUnsigned:
    case Collective::kReduceMinSigned:
    case Collective::kReduceMaxSigned:
    case Collective::kReduceAnd:
    case Collective::kReduceOr:
    case Collective::kReduceXor: {
      bool first = true;
      uint32_t acc = 0;
      for (unsigned bit = 0; bit < kWarp; ++bit) {
        if (!(mask >> bit & 1u)) continue;
        const uint32_t v = value32(bit);
        if (first) {
          acc = v;
          first = false;
          continue;
        }
        switch (call.kind) {
          case Collective::kReduceAdd: acc += v; break;
          case Collective::kReduceMinUnsigned: acc = std::min(acc, v); break;
          case Collective::kReduceMaxUnsigned: acc = std::max(acc, v); break;
          case Collective::kReduceMinSigned:
            acc = static_cast<uint32_t>(std::min(static_cast<int32_t>(acc), static_cast<int32_t>(v)));
            break;
          case Collective::kReduceMaxSigned:
            acc = static_cast<uint32_t>(std::max(static_cast<int32_t>(acc), static_cast<int32_t>(v)));
            break;
          case Collective::kReduceAnd: acc &= v; break;
          case Collective::kReduceOr: acc |= v; break;
          default: acc ^= v; break;
        }
      }
      common = acc;
      break;
    }
    default: break;
  }
  for (unsigned bit = 0; bit < kWarp; ++bit) {
    if (!(mask >> bit & 1u)) continue;
    switch (call.kind) {
      case Collective::kShflIdx:
      case Collective::kShflUp:
      case Collective::kShflDown:
      case Collective::kShflXor: {
        const unsigned source = shuffle_source(calls[bit], bit);
        if (!(mask >> source & 1u)) return static_cast<int>(bit);
        results[bit] = calls[source].value;
        break;
      }
      case Collective::kMatchAny:
      case Collective::kMatchAll: {
        uint32_t same = 0;
        for (unsigned other = 0; other < kWarp; ++other) {
          if ((mask >> other & 1u) && calls[other].value == calls[bit].value) same |= 1u << other;
        }
        results[bit] = call.kind == Collective::kMatchAny ? same
                       : same == mask                     ? (uint64_t{1} << 32) | mask
                                                          : 0;
        break;
      }
      default: results[bit] = common; break;
    }
  }
  return -1;
}

}  // namespace dynemb::emulation
