// Data types, reduction ops and collective kinds shared by every layer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace ringcomm {

enum class DataType : int32_t {
  Float32 = 0,
  Float64,
  Float16,
  BFloat16,
  Int8,
  UInt8,
  Int32,
  Int64,
  Bool,
};

enum class RedOp : int32_t {
  Sum = 0,
  Prod,
  Min,
  Max,
  Avg,
  BAnd,
  BOr,
  BXor,
  LAnd,
  LOr,
};

enum class Primitive : int32_t {
  AllReduce = 0,
  ReduceScatter,
  AllGather,
  Broadcast,
  Reduce,
  Gather,
  Scatter,
  AllToAll,  // point-to-point (csrc/core/point_to_point.cc)
  SendRecv,
};

size_t dataTypeSize(DataType type);
const char* dataTypeName(DataType type);
const char* redOpName(RedOp op);
const char* primitiveName(Primitive primitive);

bool isFloatingPoint(DataType type);
// Whether `op` is defined for `type`; when not, `why` says so in a sentence.
bool opSupported(RedOp op, DataType type, std::string* why = nullptr);

}  // namespace ringcomm
