// Lookups in the algorithm table (algorithms.h).
#include "ringcomm/algorithms.h"

#include <iterator>

namespace ringcomm {
namespace {

// The row of `algorithm`, or null for a value outside the enum.
const AlgorithmInfo* rowOf(Algorithm algorithm) {
  const auto index = static_cast<size_t>(algorithm);
  return index < std::size(kAlgorithms) ? &kAlgorithms[index] : nullptr;
}

}  // namespace

const char* algorithmName(Algorithm algorithm) {
  const AlgorithmInfo* row = rowOf(algorithm);
  return row ? row->name : "unknown";
}

bool algorithmPlans(Algorithm algorithm, Primitive primitive) {
  const AlgorithmInfo* row = rowOf(algorithm);
  return row != nullptr && static_cast<size_t>(primitive) < std::size(kPrimitives) &&
         (row->primitives & primitiveBit(primitive)) != 0;
}

bool isOneHop(Algorithm algorithm) {
  const AlgorithmInfo* row = rowOf(algorithm);
  return row != nullptr && row->oneHop;
}

}  // namespace ringcomm
