// dynemb emulated CUDA executor: the CUDA backend (torch/cuda_backend.h) over CPU
// tensors, registered as the op library `dynemb_cuda_emulated` (the schemas of
// ops.cpp); dynemb/_ops.py sends every op there when DYNEMB_EXECUTOR=cuda-emulated.
#define DYNEMB_CUDA_EMULATION 1

#include <torch/library.h>

#include "torch/cuda_backend.h"
#include "torch/op_schemas.h"

namespace dynemb {
namespace {

struct EmulatedRuntime {
  static cudaStream_t stream() { return nullptr; }  // launches run synchronously
  struct DeviceGuard {
    explicit DeviceGuard(at::Device) {}
  };
  static at::Tensor host_bytes(int64_t n) { return at::empty({n}, at::kByte); }
  static at::Tensor to_device(const at::Tensor& host, at::Device) { return host; }  // the CPU
  /// A read of device values by the host (a wait for the stream on a GPU): counted.
  static at::Tensor to_host(const at::Tensor& device) {
    emulation::count_host_read();
    return device;
  }
};

}  // namespace

/// [launches, memsets, blocks, threads, host_reads] since the process started (cuda_shim.h
/// Counters): how many kernels and memsets the ops called would launch on a GPU, and how
/// often they would wait to read device values back.
std::vector<int64_t> emulation_counters() {
  const emulation::Counters c = emulation::counters();
  return {static_cast<int64_t>(c.launches), static_cast<int64_t>(c.memsets),
          static_cast<int64_t>(c.blocks), static_cast<int64_t>(c.threads),
          static_cast<int64_t>(c.host_reads)};
}

namespace emulation {
std::vector<int64_t> access_counts(bool reset);  // access_count.cpp
void count_accesses(bool on);
}  // namespace emulation

/// Turns the count of table accesses on or off (and empties it): core/access_count.h.
void emulation_count_accesses(bool on) { emulation::count_accesses(on); }

/// [bytes, lines] x [metadata read, metadata written, rows read, rows written], then the
/// lines of metadata and of rows read or written: the distinct table bytes and 64-byte
/// lines the ops accessed since the count was last emptied (`reset`: empty it now).
std::vector<int64_t> emulation_accesses(bool reset) { return emulation::access_counts(reset); }

TORCH_LIBRARY(dynemb_cuda_emulated, m) {
  DYNEMB_DEFINE_OPS(m);
  m.def("emulation_counters() -> int[]", &emulation_counters);
  m.def("emulation_count_accesses(bool on) -> ()", &emulation_count_accesses);
  m.def("emulation_accesses(bool reset) -> int[]", &emulation_accesses);
}

TORCH_LIBRARY_IMPL(dynemb_cuda_emulated, CPU, m) {
  DYNEMB_REGISTER_TABLE_OPS(m, CudaBackend<EmulatedRuntime>);
  DYNEMB_REGISTER_EMBEDDING_OPS(m, CudaBackend<EmulatedRuntime>);
  DYNEMB_REGISTER_QUANTIZED_OPS(m, CudaBackend<EmulatedRuntime>);
  DYNEMB_REGISTER_SLOT_OPS(m, CudaBackend<EmulatedRuntime>);
}

}  // namespace dynemb
