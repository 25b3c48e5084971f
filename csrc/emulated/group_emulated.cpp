// dynemb emulated CUDA executor: csrc/cuda/group_cuda.cu built for the host (cuda/runtime.cuh).
#define DYNEMB_CUDA_EMULATION 1
#include "cuda/group_cuda.cu"
