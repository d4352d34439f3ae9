// CudaReducer: the Reducer interface on one GPU. Enqueues kernels and copies on a stream it is
// given and never blocks the host; the transport decides which stream that is. Its device must
// be current when it is called (the transport makes it so for each collective, in begin()), so a
// step costs no device query or switch.
#pragma once

#include <cuda_runtime_api.h>

#include "cuda/reduce_kernels.h"
#include "ringcomm/reducer.h"

namespace ringcomm {
inline namespace RC_KERNEL_BUILD {  // kernel_build.h

class CudaReducer : public Reducer {
 public:
  // `smsForNccl`: SMs its kernels leave to NCCL's (reduce_kernels.h).
  CudaReducer(int device, cudaStream_t stream, int smsForNccl)
      : device_(device), stream_(stream), smsForNccl_(smsForNccl) {}

  void reduce(void* result, void* message, const void* a, const void* b, size_t n,
              const ReduceSpec& spec, bool finalize) override;
  void copy(void* result, void* message, const void* src, size_t bytes) override;
  // float32 <-> float16/bfloat16 in one kernel (a 16-bit wire); a plain copy when the types match.
  void convert(void* result, void* message, const void* src, bool srcIsWire, size_t n,
               const ReduceSpec& spec) override;

  cudaStream_t stream() const { return stream_; }
  int device() const { return device_; }

 private:
  int device_;
  cudaStream_t stream_;
  int smsForNccl_;
};

}  // inline namespace RC_KERNEL_BUILD
}  // namespace ringcomm
