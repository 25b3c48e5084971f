// dynemb emulated CUDA executor: csrc/cuda/table_cuda.cu built for the host (cuda/runtime.cuh).
#define DYNEMB_CUDA_EMULATION 1
#include "cuda/table_cuda.cu"
