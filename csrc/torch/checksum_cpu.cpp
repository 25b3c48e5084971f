// dynemb torch layer: CPU registration of crc32 (checkpoint file checks, cpu/crc32_cpu.h).
#include <ATen/ATen.h>
#include <torch/library.h>

#include <cstdint>

#include "cpu/crc32_cpu.h"
#include "torch/tensor_checks.h"

namespace dynemb {
namespace {

/// CRC-32 of a contiguous 1-D uint8 tensor continued from `crc` (0 to start); the
/// value zlib.crc32(bytes, crc) returns.
int64_t crc32_cpu(const at::Tensor& data, int64_t crc) {
  check_tensor("crc32", "data", data, at::kByte, 1);
  TORCH_CHECK_VALUE(crc >= 0 && crc <= 0xFFFFFFFFll,
                    "dynemb.crc32: `crc` must be in [0, 2^32), got ", crc);
  return cpu::crc32(data.data_ptr<uint8_t>(), static_cast<size_t>(data.numel()),
                    static_cast<uint32_t>(crc));
}

}  // namespace

TORCH_LIBRARY_IMPL(dynemb, CPU, m) { m.impl("crc32", &crc32_cpu); }

}  // namespace dynemb
