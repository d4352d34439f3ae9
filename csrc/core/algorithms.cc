#include "ringcomm/algorithms.h"

namespace ringcomm {

Algorithm chooseAlgorithm(Primitive primitive, size_t bytes, int worldSize, bool publications,
                          const AlgorithmThresholds& thresholds) {
  if (worldSize == 1 || !publications) return Algorithm::Ring;
  // At 2 ranks the ring already takes two_shot's two hops (one for reduce_scatter and
  // all_gather) and copies less: only one_shot all_reduce saves a hop there.
  const bool saves = worldSize > 2;
  switch (primitive) {
    case Primitive::AllReduce:
      // one_shot: one hop, but every rank reads N inputs; two_shot: two hops, each rank reads
      // about twice the tensor; the ring: 2(N-1) hops, bandwidth-optimal.
      if (bytes <= thresholds.oneShotMaxBytes) return Algorithm::OneShot;
      return saves && bytes <= thresholds.twoShotMaxBytes ? Algorithm::TwoShot : Algorithm::Ring;
    case Primitive::ReduceScatter:
    case Primitive::AllGather:
      // Their one_shot reads what the ring moves, in one hop: two_shot's halves.
      return saves && bytes <= thresholds.twoShotMaxBytes ? Algorithm::OneShot : Algorithm::Ring;
    default:
      return Algorithm::Ring;
  }
}

}  // namespace ringcomm
