// dynemb core: the emulated build's count of the table bytes an op reads and writes.
//
// TableRef's accessors (table_ref.h) report each metadata and row access through
// DYNEMB_COUNT_ACCESS. In the emulated CUDA executor (csrc/emulated) it feeds a counter
// (emulation::count_access: bytes and distinct 64-byte lines, per kind), read by
// dynemb._executor.emulation_accesses; everywhere else (the CPU executor, a GPU) it
// expands to nothing, so the hot path pays nothing.
//
// One definition rule: the core is compiled into the CPU and the emulated translation
// units of one library, with and without the hook. Every function that calls it is
// therefore DYNEMB_INLINE (inlined where it is used, so each unit runs its own body)
// or a template of an emulated-only type (a Platform, a Tile), never a function the
// two builds share out of line.
#pragma once

#include "core/macros.h"

namespace dynemb {

/// What an access touched: metadata (digests, keys, scores, timestamps, pins,
/// overflow flags, bucket locks) or rows, read or written.
enum class Access : int { kMetaRead = 0, kMetaWrite = 1, kRowRead = 2, kRowWrite = 3 };
constexpr int kAccessKinds = 4;

}  // namespace dynemb

#if defined(DYNEMB_CUDA_EMULATION) && !defined(__CUDACC__)
namespace dynemb::emulation {
/// Counts `bytes` at `p` under `kind` while counting is on (launch.cpp).
void count_access(int kind, const void* p, int64_t bytes);
}  // namespace dynemb::emulation
#define DYNEMB_COUNT_ACCESS(kind, p, bytes) \
  ::dynemb::emulation::count_access(static_cast<int>(kind), (p), (bytes))
#else
#define DYNEMB_COUNT_ACCESS(kind, p, bytes) ((void)0)
#endif
