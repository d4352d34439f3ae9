// Elementwise reduction kernels: result and/or message = op(a, b) for one dtype and op, on a
// stream (the rank's result and the next hop's message, as in Reducer::reduce).
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
  void* result = nullptr;  // either output may be null; outputs may alias a or b
  void* message = nullptr;
  const void* a = nullptr;
  const void* b = nullptr;
  size_t n = 0;  // elements
  DataType type = DataType::Float32;   // result and a
  // message and b, when they differ from `type`: float16 or bfloat16 under float32 (a 16-bit
  // wire). Accumulation stays float32; when message is written, result gets the value rounded to
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

// Between float32 (result) and a 16-bit wire type (message) for n elements. src is in the wire
// type when srcIsWire (message = src, result = src widened), else float32 (message = src rounded
// to nearest even, result = src). Either output may be null or be src itself.
struct ConvertLaunch {
  void* result = nullptr;
  void* message = nullptr;
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
