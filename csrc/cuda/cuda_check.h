// RC_CUDA_CHECK: every CUDA runtime call is checked.
#pragma once

#include <cuda_runtime_api.h>

#include "ringcomm/error.h"

#define RC_CUDA_CHECK(call)                                                                  \
  do {                                                                                       \
    cudaError_t rc_cuda_status_ = (call);                                                    \
    if (rc_cuda_status_ != cudaSuccess) {                                                    \
      (void)cudaGetLastError(); /* clear a sticky-free error so the next call starts clean */ \
      RC_THROW("CUDA call ", #call, " failed: ", cudaGetErrorName(rc_cuda_status_), " (",    \
               cudaGetErrorString(rc_cuda_status_), ")");                                    \
    }                                                                                        \
  } while (0)
