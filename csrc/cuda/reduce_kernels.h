// Elementwise reduction kernels: out0 and/or out1 = op(a, b) for one dtype and op, on a stream.
// Plain C++ header (no CUDA includes) so host code and bindings can call it; the stream is a
// cudaStream_t passed as void*.
#pragma once

#include <cstddef>
#include <optional>

#include "cuda/kernel_build.h"
#include "ringcomm/types.h"

namespace ringcomm {
inline namespace RC_KERNEL_BUILD {

struct ReduceLaunch {
  void* out0 = nullptr;  // either output may be null; outputs may alias a or b
  void* out1 = nullptr;
  const void* a = nullptr;
  const void* b = nullptr;
  size_t n = 0;  // elements
  DataType type = DataType::Float32;   // out0 and a
  // out1 and b, when they differ from `type`: float16 or bfloat16 under float32 (a 16-bit
  // wire). Accumulation stays float32; when out1 is written, out0 gets the value rounded to
  // the wire type, as in csrc/cpu/cpu_reducer.cc.
  std::optional<DataType> wireType;
  RedOp op = RedOp::Sum;
  int divisor = 1;      // AVG divides the result by this when `finalize` is set
  bool finalize = false;
  // SMs the kernel leaves to NCCL's own CTAs (its send/recv kernels overlap ours; NCCL uses a
  // few channels per peer, one CTA each): CommOptions.nccl_sms, set by the caller.
  int smsForNccl = 0;
  int device = -1;  // the current device, whose SM count sizes the grid (-1: ask CUDA)
};

// Enqueues the reduction on `stream` (a cudaStream_t) on the current device. The caller has
// checked the (dtype, op) pair (opSupported: Communicator::prepare, once per call). Raises
// ringcomm::Error for a bad wire type.
void launchReduce(const ReduceLaunch& launch, void* stream);

// Between float32 (out0) and a 16-bit wire type (out1) for n elements. src is in the wire type
// when srcIsWire (out1 = src, out0 = src widened), else float32 (out1 = src rounded to nearest
// even, out0 = src). Either output may be null or be src itself.
struct ConvertLaunch {
  void* out0 = nullptr;
  void* out1 = nullptr;
  const void* src = nullptr;
  bool srcIsWire = false;
  size_t n = 0;  // elements
  DataType wireType = DataType::BFloat16;
  int smsForNccl = 0;  // as in ReduceLaunch
  int device = -1;  // as in ReduceLaunch
};

void launchConvert(const ConvertLaunch& launch, void* stream);

}  // inline namespace RC_KERNEL_BUILD
}  // namespace ringcomm
