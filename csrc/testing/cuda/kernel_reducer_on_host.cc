// Test-only: the host build's CudaReducer (kernel_runtime.h). This file is compiled like the
// kernels' own host build, so cuda/cuda_reducer.h declares that build's class.
#include "testing/cuda/kernels_on_host.h"

#include "cuda/cuda_reducer.h"

namespace ringcomm::hostkern {

std::shared_ptr<Reducer> makeCudaReducer(int device, cudaStream_t stream, int smsForNccl) {
  return std::make_shared<CudaReducer>(device, stream, smsForNccl);
}

}  // namespace ringcomm::hostkern
