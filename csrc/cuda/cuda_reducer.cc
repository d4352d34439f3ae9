// CudaReducer: kernels from reduce_kernels.cu, copies as asynchronous device-to-device memcpy.
#include "cuda/cuda_reducer.h"

#include "cuda/cuda_check.h"
#include "cuda/reduce_kernels.h"

namespace ringcomm {
inline namespace RC_KERNEL_BUILD {  // kernel_build.h

void CudaReducer::reduce(void* out0, void* out1, const void* a, const void* b, size_t n,
                         const ReduceSpec& spec, bool finalize) {
  ReduceLaunch l;
  l.out0 = out0;
  l.out1 = out1;
  l.a = a;
  l.b = b;
  l.n = n;
  l.type = spec.type;
  if (spec.wireType != spec.type) l.wireType = spec.wireType;  // launchReduce checks the pair
  l.op = spec.op;
  l.divisor = spec.divisor;
  l.finalize = finalize;
  l.smsForNccl = smsForNccl_;
  l.device = device_;
  launchReduce(l, stream_);
}

void CudaReducer::convert(void* out0, void* out1, const void* src, bool srcIsWire, size_t n,
                          const ReduceSpec& spec) {
  if (spec.wireType == spec.type) return copy(out0, out1, src, n * dataTypeSize(spec.type));
  checkWireType(spec.type, spec.wireType);
  ConvertLaunch l;
  l.out0 = out0;
  l.out1 = out1;
  l.src = src;
  l.srcIsWire = srcIsWire;
  l.n = n;
  l.wireType = spec.wireType;
  l.smsForNccl = smsForNccl_;
  l.device = device_;
  launchConvert(l, stream_);
}

void CudaReducer::copy(void* out0, void* out1, const void* src, size_t bytes) {
  if (bytes == 0) return;
  for (void* out : {out0, out1})
    if (out != nullptr && out != src)
      RC_CUDA_CHECK(cudaMemcpyAsync(out, src, bytes, cudaMemcpyDeviceToDevice, stream_));
}

}  // inline namespace RC_KERNEL_BUILD
}  // namespace ringcomm
