// CudaReducer: kernels from reduce_kernels.cu, copies as asynchronous device-to-device memcpy.
#include "cuda/cuda_reducer.h"

#include "cuda/cuda_check.h"
#include "cuda/reduce_kernels.h"

namespace ringcomm {
inline namespace RC_KERNEL_BUILD {  // kernel_build.h

void CudaReducer::reduce(void* result, void* message, const void* a, const void* b, size_t n,
                         const ReduceSpec& spec, bool finalize) {
  ReduceLaunch launch;
  launch.result = result;
  launch.message = message;
  launch.a = a;
  launch.b = b;
  launch.n = n;
  launch.type = spec.type;
  if (spec.wireType != spec.type) launch.wireType = spec.wireType;  // launchReduce checks the pair
  launch.op = spec.op;
  launch.divisor = spec.divisor;
  launch.finalize = finalize;
  launch.smsForNccl = smsForNccl_;
  launch.device = device_;
  launchReduce(launch, stream_);
}

void CudaReducer::convert(void* result, void* message, const void* src, bool srcIsWire, size_t n,
                          const ReduceSpec& spec) {
  if (spec.wireType == spec.type) return copy(result, message, src, n * dataTypeSize(spec.type));
  checkWireType(spec.type, spec.wireType);
  ConvertLaunch launch;
  launch.result = result;
  launch.message = message;
  launch.src = src;
  launch.srcIsWire = srcIsWire;
  launch.n = n;
  launch.wireType = spec.wireType;
  launch.smsForNccl = smsForNccl_;
  launch.device = device_;
  launchConvert(launch, stream_);
}

void CudaReducer::copy(void* result, void* message, const void* src, size_t bytes) {
  if (bytes == 0) return;
  for (void* out : {result, message})
    if (out != nullptr && out != src)
      RC_CUDA_CHECK(cudaMemcpyAsync(out, src, bytes, cudaMemcpyDeviceToDevice, stream_));
}

}  // inline namespace RC_KERNEL_BUILD
}  // namespace ringcomm
