// dynemb CPU: CRC-32 (ISO-HDLC, the polynomial of zlib.crc32 / gzip / PNG) of host
// memory, fast enough that verifying a checkpoint costs less than reading it.
//
// zlib 1.2's table-driven crc32 runs at ~1 GB/s per core here, below a disk's
// sequential read; this one folds 64-byte blocks with carry-less multiplication
// (PCLMULQDQ, Intel's "Fast CRC Computation for Generic Polynomials Using
// PCLMULQDQ", as in Chromium's zlib) at ~10 GB/s, and falls back to a slice-by-8
// table where the instruction is missing. Results are identical to zlib.crc32.
#pragma once

#include <cstddef>
#include <cstdint>

namespace dynemb::cpu {

/// CRC-32 of `data[0, n)` continued from `crc` (0 to start), as zlib.crc32(data, crc).
/// @param data (n) bytes, any alignment
uint32_t crc32(const uint8_t* data, size_t n, uint32_t crc);

}  // namespace dynemb::cpu
