// Reducer: the arithmetic of a collective on one device. Kernels see raw pointers and counts.
#pragma once

#include <cstddef>

#include "ringcomm/types.h"

namespace ringcomm {

struct ReduceSpec {
  DataType type = DataType::Float32;      // the caller's buffers
  RedOp op = RedOp::Sum;
  int divisor = 1;                        // AVG divides by this once, when a step finalizes
  DataType wireType = DataType::Float32;  // messages; differs from `type` for a 16-bit wire
};

// float32 buffers may travel as float16 or bfloat16 (accumulation stays float32).
bool wireTypeSupported(DataType type, DataType wireType);
// Raises a user-facing error when wireTypeSupported is false.
void checkWireType(DataType type, DataType wireType);

class Reducer {
 public:
  virtual ~Reducer() = default;
  // out0 and out1 (either may be null) = op(a, b) over n elements; then / divisor if finalize
  // and the op is AVG. Outputs may alias a or b. out0 and a are in spec.type, out1 and b in
  // spec.wireType; when both outputs are written, out0 gets the value rounded to the wire type,
  // so that the rank keeping a result and the ranks receiving it hold the same bits.
  virtual void reduce(void* out0, void* out1, const void* a, const void* b, size_t n,
                      const ReduceSpec& spec, bool finalize) = 0;
  // out0 and out1 (either may be null) = src, `bytes` long.
  virtual void copy(void* out0, void* out1, const void* src, size_t bytes) = 0;
  // copy() between spec.type (out0) and spec.wireType (out1) for n elements; src is in the
  // wire type when srcIsWire. Reducers without 16-bit wire support raise.
  virtual void convert(void* out0, void* out1, const void* src, bool srcIsWire, size_t n,
                       const ReduceSpec& spec);
};

}  // namespace ringcomm
