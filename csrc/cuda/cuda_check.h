// RC_CUDA_CHECK and a device guard: every CUDA runtime call is checked, and code that must run
// on a communicator's device restores the caller's current device afterwards.
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

namespace ringcomm {

// Makes `device` current for the guard's lifetime (the caller's thread may be on another one).
class CudaDeviceGuard {
 public:
  explicit CudaDeviceGuard(int device) {
    RC_CUDA_CHECK(cudaGetDevice(&previous_));
    if (previous_ != device) RC_CUDA_CHECK(cudaSetDevice(device));
  }
  ~CudaDeviceGuard() {
    int current = -1;
    if (cudaGetDevice(&current) == cudaSuccess && current != previous_) cudaSetDevice(previous_);
  }
  CudaDeviceGuard(const CudaDeviceGuard&) = delete;
  CudaDeviceGuard& operator=(const CudaDeviceGuard&) = delete;

 private:
  int previous_ = 0;
};

}  // namespace ringcomm
