// Which algorithm a collective runs with when asked for Auto: decided from what every rank
// shares (the collective, its size, the world size, the transport and the thresholds, which
// every rank resolves from the same options), so all ranks choose the same.
#pragma once

#include <cstddef>

#include "ringcomm/transport.h"
#include "ringcomm/types.h"

namespace ringcomm {

// Provisional defaults, also CommOptions' (one_shot_max_bytes / two_shot_max_bytes override
// them); docs/design.md says what they rest on.
struct AlgorithmThresholds {
  size_t oneShotMaxBytes = 32 * 1024;   // all_reduce: one_shot up to here
  size_t twoShotMaxBytes = 512 * 1024;  // all_reduce: two_shot up to here; reduce_scatter and
                                        // all_gather (two_shot's halves): one_shot
};

// `bytes`: the whole tensor of an all_reduce, the input of a reduce_scatter, the output of an
// all_gather. Ring for everything else, for one rank, and on transports without publications.
Algorithm chooseAlgorithm(Primitive primitive, size_t bytes, int worldSize,
                          const Transport& transport, const AlgorithmThresholds& thresholds);

}  // namespace ringcomm
