// Reducer: the arithmetic of a collective on one device. Kernels see raw pointers and counts.
#pragma once

#include <cstddef>

#include "ringcomm/types.h"

namespace ringcomm {

struct ReduceSpec {
  DataType type = DataType::Float32;
  RedOp op = RedOp::Sum;
  int divisor = 1;  // AVG divides by this once, when a step finalizes
};

class Reducer {
 public:
  virtual ~Reducer() = default;
  // out0 and out1 (either may be null) = op(a, b) over n elements; then / divisor if finalize
  // and the op is AVG. Outputs may alias a or b.
  virtual void reduce(void* out0, void* out1, const void* a, const void* b, size_t n,
                      const ReduceSpec& spec, bool finalize) = 0;
  // out0 and out1 (either may be null) = src, `bytes` long.
  virtual void copy(void* out0, void* out1, const void* src, size_t bytes) = 0;
};

}  // namespace ringcomm
