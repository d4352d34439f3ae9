// Data types, reduction ops and collectives shared by every layer, each with one table of its
// properties (types.cc) that the bindings, the checks and the tests read.
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

// A collective (its plan's steps are StepKinds: see schedule.h).
enum class Collective : int32_t {
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

// How a collective moves its data: the algorithm table, algorithms.h.
enum class Algorithm : int32_t;

enum class TypeClass { Floating, Integer, Bool };

struct DataTypeInfo {
  DataType type;
  const char* name;  // as in torch and numpy
  size_t size;
  TypeClass kind;
};

// Which data types an op is defined for, by class.
struct RedOpInfo {
  RedOp op;
  const char* name;  // as in torch.distributed.ReduceOp, lower case
  bool floating, integer, boolean;
};

// What a collective's `count` counts (CollectiveRequest, communicator.h): the one tensor it
// works on in place; this rank's block of the output, whose input holds every rank's block
// (reduce_scatter, scatter); or this rank's block of the input, whose output holds every rank's
// (all_gather, gather). Point-to-point calls count what goes to each peer.
enum class Layout { InPlace, OutputBlock, InputBlock, PerPeer };

struct CollectiveInfo {
  Collective collective;
  const char* name;  // as in torch.distributed
  bool planned;      // makePlan has a schedule for it (the rest are point-to-point)
  bool reduces;      // takes an op
  const char* root;  // the root rank's role as torch names the argument ("src", "dst"), or null
  Layout layout;
  bool wire;         // float32 data may travel on a 16-bit wire
};

// A set of collectives, as bits.
constexpr uint32_t collectiveBit(Collective collective) {
  return uint32_t{1} << static_cast<int>(collective);
}

// Every value of each enum, in enum order (checked below).
inline constexpr DataTypeInfo kDataTypes[] = {
    {DataType::Float32, "float32", 4, TypeClass::Floating},
    {DataType::Float64, "float64", 8, TypeClass::Floating},
    {DataType::Float16, "float16", 2, TypeClass::Floating},
    {DataType::BFloat16, "bfloat16", 2, TypeClass::Floating},
    {DataType::Int8, "int8", 1, TypeClass::Integer},
    {DataType::UInt8, "uint8", 1, TypeClass::Integer},
    {DataType::Int32, "int32", 4, TypeClass::Integer},
    {DataType::Int64, "int64", 8, TypeClass::Integer},
    {DataType::Bool, "bool", 1, TypeClass::Bool},
};

// The one definition of which op applies to which data types.
inline constexpr RedOpInfo kRedOps[] = {
    // op, name, then defined for: floating, integer, bool
    {RedOp::Sum, "sum", true, true, true},
    {RedOp::Prod, "prod", true, true, true},
    {RedOp::Min, "min", true, true, true},
    {RedOp::Max, "max", true, true, true},
    {RedOp::Avg, "avg", true, true, false},
    {RedOp::BAnd, "band", false, true, true},
    {RedOp::BOr, "bor", false, true, true},
    {RedOp::BXor, "bxor", false, true, true},
    {RedOp::LAnd, "land", false, true, true},
    {RedOp::LOr, "lor", false, true, true},
};

inline constexpr CollectiveInfo kCollectives[] = {
    // collective, name, planned, reduces, root, layout, wire
    {Collective::AllReduce, "all_reduce", true, true, nullptr, Layout::InPlace, true},
    {Collective::ReduceScatter, "reduce_scatter", true, true, nullptr, Layout::OutputBlock, false},
    {Collective::AllGather, "all_gather", true, false, nullptr, Layout::InputBlock, false},
    {Collective::Broadcast, "broadcast", true, false, "src", Layout::InPlace, false},
    {Collective::Reduce, "reduce", true, true, "dst", Layout::InPlace, false},
    {Collective::Gather, "gather", true, false, "dst", Layout::InputBlock, false},
    {Collective::Scatter, "scatter", true, false, "src", Layout::OutputBlock, false},
    {Collective::AllToAll, "all_to_all", false, false, nullptr, Layout::PerPeer, false},
    {Collective::SendRecv, "send_recv", false, false, nullptr, Layout::PerPeer, false},
};

// The collectives every ring plans (kCollectives' planned rows).
constexpr uint32_t plannedCollectives() {
  uint32_t bits = 0;
  for (const CollectiveInfo& row : kCollectives)
    if (row.planned) bits |= collectiveBit(row.collective);
  return bits;
}

template <typename Row, size_t N, typename Key>
constexpr bool inEnumOrder(const Row (&table)[N], Key key) {
  for (size_t i = 0; i < N; ++i)
    if (static_cast<size_t>(key(table[i])) != i) return false;
  return true;
}
static_assert(inEnumOrder(kDataTypes, [](const DataTypeInfo& r) { return r.type; }));
static_assert(inEnumOrder(kRedOps, [](const RedOpInfo& r) { return r.op; }));
static_assert(inEnumOrder(kCollectives, [](const CollectiveInfo& r) { return r.collective; }));

size_t dataTypeSize(DataType type);
const char* dataTypeName(DataType type);
const char* redOpName(RedOp op);
const char* collectiveName(Collective collective);
// The collective's row; raises for a value outside the enum.
const CollectiveInfo& collectiveInfo(Collective collective);

bool isFloatingPoint(DataType type);

struct Envelope;  // transport.h
// The header every message of one collective carries (sequence, bytes and offset left 0): the
// executor's and the debug-mode descriptor's single source.
Envelope collectiveHeader(Collective collective, uint64_t count, DataType type, RedOp op, int root,
                          DataType wireType, Algorithm algorithm);
// "all_reduce (count 1000, float32, sum, root 0)": the collective an envelope belongs to.
std::string describeCollective(const Envelope& envelope);
// Whether `op` is defined for `type` (kRedOps); when not, `why` says so in a sentence.
bool opSupported(RedOp op, DataType type, std::string* why = nullptr);

}  // namespace ringcomm
