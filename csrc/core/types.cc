// Names and properties of data types, ops and primitives.
#include "ringcomm/types.h"

#include "ringcomm/error.h"
#include "ringcomm/reducer.h"
#include "ringcomm/transport.h"

namespace ringcomm {

size_t dataTypeSize(DataType type) {
  switch (type) {
    case DataType::Float32: return 4;
    case DataType::Float64: return 8;
    case DataType::Float16: return 2;
    case DataType::BFloat16: return 2;
    case DataType::Int8: return 1;
    case DataType::UInt8: return 1;
    case DataType::Int32: return 4;
    case DataType::Int64: return 8;
    case DataType::Bool: return 1;
  }
  RC_THROW("unknown data type ", static_cast<int>(type));
}

const char* dataTypeName(DataType type) {
  switch (type) {
    case DataType::Float32: return "float32";
    case DataType::Float64: return "float64";
    case DataType::Float16: return "float16";
    case DataType::BFloat16: return "bfloat16";
    case DataType::Int8: return "int8";
    case DataType::UInt8: return "uint8";
    case DataType::Int32: return "int32";
    case DataType::Int64: return "int64";
    case DataType::Bool: return "bool";
  }
  return "unknown";
}

const char* redOpName(RedOp op) {
  switch (op) {
    case RedOp::Sum: return "sum";
    case RedOp::Prod: return "prod";
    case RedOp::Min: return "min";
    case RedOp::Max: return "max";
    case RedOp::Avg: return "avg";
    case RedOp::BAnd: return "band";
    case RedOp::BOr: return "bor";
    case RedOp::BXor: return "bxor";
    case RedOp::LAnd: return "land";
    case RedOp::LOr: return "lor";
  }
  return "unknown";
}

const char* primitiveName(Primitive primitive) {
  switch (primitive) {
    case Primitive::AllReduce: return "all_reduce";
    case Primitive::ReduceScatter: return "reduce_scatter";
    case Primitive::AllGather: return "all_gather";
    case Primitive::Broadcast: return "broadcast";
    case Primitive::Reduce: return "reduce";
    case Primitive::Gather: return "gather";
    case Primitive::Scatter: return "scatter";
    case Primitive::AllToAll: return "all_to_all";
    case Primitive::SendRecv: return "send/recv";
  }
  return "unknown";
}

bool isFloatingPoint(DataType type) {
  return type == DataType::Float32 || type == DataType::Float64 || type == DataType::Float16 ||
         type == DataType::BFloat16;
}

bool opSupported(RedOp op, DataType type, std::string* why) {
  const bool bitwise = op == RedOp::BAnd || op == RedOp::BOr || op == RedOp::BXor ||
                       op == RedOp::LAnd || op == RedOp::LOr;
  std::string reason;
  if (bitwise && isFloatingPoint(type))
    reason = detail::concat("op '", redOpName(op), "' is only defined for integer and bool ",
                            "tensors, not ", dataTypeName(type));
  else if (op == RedOp::Avg && type == DataType::Bool)
    reason = "op 'avg' is not defined for bool tensors";
  if (why != nullptr) *why = reason;
  return reason.empty();
}

std::string describeEnvelope(const Envelope& e) {
  std::string wire;
  if (e.wireType != e.dataType)
    wire = detail::concat(" on a ", dataTypeName(static_cast<DataType>(e.wireType)), " wire");
  return detail::concat(primitiveName(static_cast<Primitive>(e.primitive)), " #", e.sequence,
                        " (count ", e.count, ", ", dataTypeName(static_cast<DataType>(e.dataType)),
                        wire, ", ", redOpName(static_cast<RedOp>(e.op)), ", root ", e.root, ", ",
                        e.bytes, "-byte message at element ", e.offset, ")");
}

void Transport::forward(int from, int to, const Envelope&) {
  RC_THROW("this transport cannot forward a message from rank ", from, " to rank ", to,
           " in place");
}

bool wireTypeSupported(DataType type, DataType wireType) {
  return wireType == type || (type == DataType::Float32 && (wireType == DataType::Float16 ||
                                                            wireType == DataType::BFloat16));
}

void checkWireType(DataType type, DataType wireType) {
  RC_CHECK(wireTypeSupported(type, wireType), dataTypeName(type), " data cannot travel as ",
           dataTypeName(wireType), " (a 16-bit wire is for float32 tensors)");
}

void Reducer::convert(void* out0, void* out1, const void* src, bool srcIsWire, size_t n,
                      const ReduceSpec& spec) {
  RC_CHECK(spec.type == spec.wireType, "this device cannot send ", dataTypeName(spec.type),
           " data as ", dataTypeName(spec.wireType));
  copy(out0, out1, src, n * dataTypeSize(spec.type));
  (void)srcIsWire;
}

}  // namespace ringcomm
