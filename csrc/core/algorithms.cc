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

bool algorithmPlans(Algorithm algorithm, Collective collective) {
  const AlgorithmInfo* row = rowOf(algorithm);
  return row != nullptr && static_cast<size_t>(collective) < std::size(kCollectives) &&
         (row->collectives & collectiveBit(collective)) != 0;
}

bool isOneHop(Algorithm algorithm) {
  const AlgorithmInfo* row = rowOf(algorithm);
  return row != nullptr && row->oneHop;
}

}  // namespace ringcomm
