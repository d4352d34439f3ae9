// The Reducer's default convert (reducers without a 16-bit wire), and which wire types a dtype
// may travel as.
#include "ringcomm/reducer.h"

#include "ringcomm/error.h"

namespace ringcomm {

bool wireTypeSupported(DataType type, DataType wireType) {
  return wireType == type || (type == DataType::Float32 && (wireType == DataType::Float16 ||
                                                            wireType == DataType::BFloat16));
}

void checkWireType(DataType type, DataType wireType) {
  RC_CHECK(wireTypeSupported(type, wireType), dataTypeName(type), " data cannot travel as ",
           dataTypeName(wireType), " (a 16-bit wire is for float32 tensors)");
}

void Reducer::convert(void* result, void* message, const void* src, bool srcIsWire, size_t n,
                      const ReduceSpec& spec) {
  RC_CHECK(spec.type == spec.wireType, "this device cannot send ", dataTypeName(spec.type),
           " data as ", dataTypeName(spec.wireType));
  copy(result, message, src, n * dataTypeSize(spec.type));
  (void)srcIsWire;
}

}  // namespace ringcomm
