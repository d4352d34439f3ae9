// The tables of data types, ops and collectives, and what is derived from them.
#include "ringcomm/types.h"

#include "ringcomm/algorithms.h"
#include "ringcomm/error.h"
#include "ringcomm/transport.h"  // Envelope

namespace ringcomm {

namespace {

// Row of `value` in a table listed in enum order, or null for a value outside the enum.
template <typename Row, size_t N, typename Enum>
const Row* rowOf(const Row (&table)[N], Enum value) {
  const auto index = static_cast<size_t>(value);
  return index < N ? &table[index] : nullptr;
}

}  // namespace

size_t dataTypeSize(DataType type) {
  const DataTypeInfo* row = rowOf(kDataTypes, type);
  RC_CHECK(row != nullptr, "unknown data type ", static_cast<int>(type));
  return row->size;
}

const char* dataTypeName(DataType type) {
  const DataTypeInfo* row = rowOf(kDataTypes, type);
  return row ? row->name : "unknown";
}

const char* redOpName(RedOp op) {
  const RedOpInfo* row = rowOf(kRedOps, op);
  return row ? row->name : "unknown";
}

const char* collectiveName(Collective collective) {
  const CollectiveInfo* row = rowOf(kCollectives, collective);
  return row ? row->name : "unknown";
}

const CollectiveInfo& collectiveInfo(Collective collective) {
  const CollectiveInfo* row = rowOf(kCollectives, collective);
  RC_CHECK(row != nullptr, "unknown collective ", static_cast<int>(collective));
  return *row;
}

bool isFloatingPoint(DataType type) {
  const DataTypeInfo* row = rowOf(kDataTypes, type);
  return row != nullptr && row->kind == TypeClass::Floating;
}

bool opSupported(RedOp op, DataType type, std::string* why) {
  const RedOpInfo* info = rowOf(kRedOps, op);
  const DataTypeInfo* data = rowOf(kDataTypes, type);
  std::string reason;
  if (info == nullptr || data == nullptr) {
    reason = detail::concat("unknown op ", static_cast<int>(op), " or data type ",
                            static_cast<int>(type));
  } else if (data->kind == TypeClass::Floating && !info->floating) {
    reason = detail::concat("op '", info->name, "' is only defined for integer and bool ",
                            "tensors, not ", data->name);
  } else if ((data->kind == TypeClass::Integer && !info->integer) ||
             (data->kind == TypeClass::Bool && !info->boolean)) {
    reason = detail::concat("op '", info->name, "' is not defined for ", data->name, " tensors");
  }
  if (why != nullptr) *why = reason;
  return reason.empty();
}

Envelope collectiveHeader(Collective collective, uint64_t count, DataType type, RedOp op, int root,
                          DataType wireType, Algorithm algorithm) {
  Envelope e;
  e.algorithm = static_cast<int32_t>(algorithm);
  e.collective = static_cast<int32_t>(collective);
  e.dataType = static_cast<int32_t>(type);
  e.op = static_cast<int32_t>(op);
  e.root = root;
  e.wireType = static_cast<int32_t>(wireType);
  e.count = count;
  return e;
}

namespace {

// "count 1000, float32, sum, root 0", with the wire type when it differs.
std::string headerFields(const Envelope& e) {
  std::string wire;
  if (e.wireType != e.dataType)
    wire = detail::concat(" on a ", dataTypeName(static_cast<DataType>(e.wireType)), " wire");
  const char* type = dataTypeName(static_cast<DataType>(e.dataType));
  const auto collective = static_cast<Collective>(e.collective);
  if (collective == Collective::SendRecv || collective == Collective::AllToAll)  // no op; root: tag
    return detail::concat("count ", e.count, ", ", type, ", tag ", e.root);
  std::string algorithm;
  if (e.algorithm != static_cast<int32_t>(Algorithm::Ring))
    algorithm = detail::concat(", ", algorithmName(static_cast<Algorithm>(e.algorithm)));
  return detail::concat("count ", e.count, ", ", type, wire, ", ",
                        redOpName(static_cast<RedOp>(e.op)), ", root ", e.root, algorithm);
}

}  // namespace

std::string describeCollective(const Envelope& e) {
  return detail::concat(collectiveName(static_cast<Collective>(e.collective)), " (",
                        headerFields(e), ")");
}

std::string describeEnvelope(const Envelope& e) {
  return detail::concat(collectiveName(static_cast<Collective>(e.collective)), " #", e.sequence,
                        " (", headerFields(e), ", ", e.bytes, "-byte message at element ",
                        e.offset, ")");
}

}  // namespace ringcomm
