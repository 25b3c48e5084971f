// dynemb emulated CUDA executor: csrc/cuda/quantized_cuda.cu built for the host (cuda/runtime.cuh).
#define DYNEMB_CUDA_EMULATION 1
#include "cuda/quantized_cuda.cu"
