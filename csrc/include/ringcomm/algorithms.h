// Which algorithm a collective runs with when asked for Auto: decided from what every rank
// shares (the collective, its size, the world size, the transport and the thresholds, which
// every rank resolves from the same options), so all ranks choose the same.
#pragma once

#include <cstddef>

#include "ringcomm/types.h"

namespace ringcomm {

// Defaults, also CommOptions' (one_shot_max_bytes / two_shot_max_bytes override them), from
// bench/tune.py on 2 cores (docs/design.md, "Defaults"): one_shot beat the ring up
// to 8 KiB at 4 ranks (0.7x at 8 B) and tied it at 2; two_shot and the one-hop halves never
// beat it beyond the noise there, so auto leaves them off (0) until a machine with a core per
// rank measures otherwise.
struct AlgorithmThresholds {
  size_t oneShotMaxBytes = 8 * 1024;  // all_reduce: one_shot up to here
  size_t twoShotMaxBytes = 0;         // all_reduce: two_shot up to here; reduce_scatter and
                                      // all_gather (two_shot's halves): one_shot
};

// `bytes`: the whole tensor of an all_reduce, the input of a reduce_scatter, the output of an
// all_gather. Ring for everything else, for one rank, and on transports without publications
// (`publications`: Transport::publishBytes() > 0). bench/tune.py asks this same function.
Algorithm chooseAlgorithm(Primitive primitive, size_t bytes, int worldSize, bool publications,
                          const AlgorithmThresholds& thresholds);

}  // namespace ringcomm
