// The algorithm table: how a collective can move its data, each algorithm's default threshold
// for `auto`, and the rule `auto` applies. Python's names (ringcomm.options.ALGORITHMS), the
// CommOptions thresholds and their defaults, the tests and bench/tune.py all read it from here.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <optional>

#include "ringcomm/types.h"

namespace ringcomm {

// Auto is a request, not a plan: the communicator picks one from what every rank shares.
enum class Algorithm : int32_t {
  Ring = 0,
  OneShot,
  TwoShot,
  Auto,
  RecursiveDoubling,
};

struct AlgorithmInfo {
  Algorithm algorithm;
  const char* name;     // as in CommOptions.algorithm and the per-call algorithm=
  uint32_t collectives;  // collectiveBit()s of the collectives it plans (Auto: accepts)
  bool oneHop;          // reads every rank's publications (Transport::publishBytes) instead of
                        // passing ring messages
  // Auto runs it for collectives up to this many bytes (chooseAlgorithm's `bytes`; 0: never);
  // CommOptions' <name>_max_bytes overrides it. None: auto never picks it by size (the ring,
  // which it falls back to; auto itself).
  std::optional<size_t> autoMaxBytes;
  const char* autoUse;  // which collectives that threshold governs, for the options table
};

// ring: schedule.h's plans, 2(N-1) steps for all_reduce, bandwidth-optimal. one_shot: every rank
// publishes its input and reads every rank's, reducing in rank order (all_reduce: the fewest
// hops, N times the bytes read). two_shot (all_reduce): each rank reduces its chunk from every
// rank's publication and publishes it, then copies every other rank's chunk. See
// docs/design.md.
// The thresholds are bench/tune.py's on 2 cores (docs/benchmarks.md, "How the defaults were
// chosen"): one_shot all_reduce beat the ring at small sizes; two_shot and the one-hop halves
// never beat it beyond the noise there, so auto leaves them off (0). A host with a core
// per rank sets its own from bench/tune.py (RINGCOMM_<NAME>_MAX_BYTES).
// recursive_doubling (all_reduce, over a transport that reaches every peer: between hosts): the
// whole tensor exchanged with rank r xor 2^k for k = 0..log2(P)-1, P the largest power of two
// up to N; the N-P ranks above P first hand theirs to rank r-P and get the result back last.
// log2(P) (+2) latencies against the ring's 2(N-1), each moving the whole tensor. Its
// threshold: the alpha-beta model's crossover against the ring, each fitted on emulated hosts
// (docs/benchmarks.md, "Between hosts: by size"), at 3 hosts, where recursive doubling gains
// least (two extra rounds of the whole tensor; ~31 KB there, far more at 8), rounded down to a
// power of two, so that auto never picks the slower of the two at any host count.
inline constexpr size_t kRecursiveDoublingMaxBytes = 16 * 1024;
inline constexpr uint32_t kOneHopCollectives = collectiveBit(Collective::AllReduce) |
                                              collectiveBit(Collective::ReduceScatter) |
                                              collectiveBit(Collective::AllGather);
inline constexpr AlgorithmInfo kAlgorithms[] = {
    {Algorithm::Ring, "ring", plannedCollectives(), false, std::nullopt, nullptr},
    {Algorithm::OneShot, "one_shot", kOneHopCollectives, true, 8 * 1024, "all_reduce"},
    {Algorithm::TwoShot, "two_shot", collectiveBit(Collective::AllReduce), true, 0,
     "all_reduce on 3 ranks or more; reduce_scatter and all_gather run one_shot, two_shot's "
     "halves, up to it"},
    {Algorithm::Auto, "auto", plannedCollectives(), false, std::nullopt, nullptr},
    {Algorithm::RecursiveDoubling, "recursive_doubling", collectiveBit(Collective::AllReduce),
     false, kRecursiveDoublingMaxBytes, "all_reduce on transports that reach every peer (TCP)"},
};
static_assert(inEnumOrder(kAlgorithms, [](const AlgorithmInfo& r) { return r.algorithm; }));

const char* algorithmName(Algorithm algorithm);
// Whether `algorithm` plans (Auto: accepts) `collective` (kAlgorithms).
bool algorithmPlans(Algorithm algorithm, Collective collective);
// Whether it runs on publications (kAlgorithms' oneHop).
bool isOneHop(Algorithm algorithm);

// What auto picks by: per algorithm with a threshold, the largest collective it runs; every
// rank resolves the same from the same options.
class AlgorithmThresholds {
 public:
  AlgorithmThresholds() {  // kAlgorithms' defaults
    for (const AlgorithmInfo& row : kAlgorithms) set(row.algorithm, row.autoMaxBytes.value_or(0));
  }
  size_t operator[](Algorithm algorithm) const { return maxBytes_[index(algorithm)]; }
  void set(Algorithm algorithm, size_t bytes) { maxBytes_[index(algorithm)] = bytes; }

 private:
  static size_t index(Algorithm algorithm) { return static_cast<size_t>(algorithm); }
  std::array<size_t, std::size(kAlgorithms)> maxBytes_{};
};

// The algorithm Auto runs. `bytes`: the whole tensor of an all_reduce, the input of a
// reduce_scatter, the output of an all_gather. The ring for everything else, for one rank, and
// on transports without publications (`publications`: Transport::publishBytes() > 0), but for
// recursive_doubling all_reduce on those that reach every peer (`reachesEveryPeer`:
// Transport::reachesEveryPeer()). bench/tune.py asks this same function.
inline Algorithm chooseAlgorithm(Collective collective, size_t bytes, int worldSize,
                                 bool publications, const AlgorithmThresholds& thresholds,
                                 bool reachesEveryPeer = false) {
  if (worldSize == 1) return Algorithm::Ring;
  if (!publications) {
    const bool fewerHops = collective == Collective::AllReduce && reachesEveryPeer;
    return fewerHops && bytes <= thresholds[Algorithm::RecursiveDoubling]
               ? Algorithm::RecursiveDoubling
               : Algorithm::Ring;
  }
  // At 2 ranks the ring already takes two_shot's two hops (one for reduce_scatter and
  // all_gather) and copies less: only one_shot all_reduce saves a hop there.
  const bool oneHopSavesAHop = worldSize > 2;
  switch (collective) {
    case Collective::AllReduce:
      // one_shot: one hop, but every rank reads N inputs; two_shot: two hops, each rank reads
      // about twice the tensor; the ring: 2(N-1) hops, bandwidth-optimal.
      if (bytes <= thresholds[Algorithm::OneShot]) return Algorithm::OneShot;
      return oneHopSavesAHop && bytes <= thresholds[Algorithm::TwoShot] ? Algorithm::TwoShot
                                                                        : Algorithm::Ring;
    case Collective::ReduceScatter:
    case Collective::AllGather:
      // Their one_shot is two_shot's halves (it reads what the ring moves, in one hop): it
      // runs up to two_shot's threshold.
      return oneHopSavesAHop && bytes <= thresholds[Algorithm::TwoShot] ? Algorithm::OneShot
                                                                        : Algorithm::Ring;
    default:
      return Algorithm::Ring;
  }
}

}  // namespace ringcomm
