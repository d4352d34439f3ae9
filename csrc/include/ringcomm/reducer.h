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
  // Two outputs, either may be null: `result`, what this rank keeps, and `message`, what goes to
  // the next hop. result and message = op(a, b) over n elements; then / divisor if finalize and
  // the op is AVG. Outputs may alias a or b. result and a are in spec.type, message and b in
  // spec.wireType; when both outputs are written, result gets the value rounded to the wire type,
  // so that the rank keeping a result and the ranks receiving it hold the same bits.
  virtual void reduce(void* result, void* message, const void* a, const void* b, size_t n,
                      const ReduceSpec& spec, bool finalize) = 0;
  // result and message (either may be null) = src, `bytes` long.
  virtual void copy(void* result, void* message, const void* src, size_t bytes) = 0;
  // copy() between spec.type (result) and spec.wireType (message) for n elements; src is in the
  // wire type when srcIsWire. Reducers without 16-bit wire support raise.
  virtual void convert(void* result, void* message, const void* src, bool srcIsWire, size_t n,
                       const ReduceSpec& spec);
};

}  // namespace ringcomm
