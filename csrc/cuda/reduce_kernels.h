// Elementwise reduction kernels: out0 and/or out1 = op(a, b) for one dtype and op, on a stream.
// Plain C++ header (no CUDA includes) so host code and bindings can call it; the stream is a
// cudaStream_t passed as void*.
#pragma once

#include <cstddef>

#include "ringcomm/types.h"

namespace ringcomm {

struct ReduceLaunch {
  void* out0 = nullptr;  // either output may be null; outputs may alias a or b
  void* out1 = nullptr;
  const void* a = nullptr;
  const void* b = nullptr;
  size_t n = 0;  // elements
  DataType type = DataType::Float32;
  RedOp op = RedOp::Sum;
  int divisor = 1;      // AVG divides the result by this when `finalize` is set
  bool finalize = false;
  float scale = 1.0f;   // multiplies the result (floating types only); 1 means none
};

// Enqueues the reduction on `stream` (a cudaStream_t) on the current device. Raises
// ringcomm::Error for an unsupported (dtype, op) or a scale on an integer type.
void launchReduce(const ReduceLaunch& launch, void* stream);

}  // namespace ringcomm
