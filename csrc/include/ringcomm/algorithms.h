// The algorithm table: how a collective can move its data, each algorithm's default threshold
// for `auto`, and the rule `auto` applies. Python's names (ringcomm.options.ALGORITHMS), the
// CommOptions thresholds and their defaults, the tests and bench/tune.py all read it from here.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <limits>
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
// chosen"): one_shot all_reduce beat the ring at small sizes; at 4 ranks two_shot took 0.6-1.0x
// the ring's mean time from 16 to 128 KiB (fewer waits for ranks that share a core; even at
// 256 KiB, slower from 1 MiB), and the one-hop reduce_scatter and all_gather 0.7-1.0x. A host with a
// core per rank sets its own from bench/tune.py (RINGCOMM_<NAME>_MAX_BYTES).
// recursive_doubling (over a transport that reaches every peer: between hosts), log2(P) rounds
// with rank r xor 2^k, P the largest power of two up to N: all_reduce exchanges the whole tensor
// (recursive_doubling_plans.cc); reduce_scatter halves the blocks it holds each round and
// all_gather doubles them (log_step_plans.cc). The N-P ranks above P hand theirs in first and
// get the result back last. Its default threshold is not one number: auto runs it up to the
// alpha-beta model's crossover against the ring for the number of ranks (logStepMaxBytes).
inline constexpr size_t kByHostCount = std::numeric_limits<size_t>::max();

// The largest collective (chooseAlgorithm's `bytes`) for which the alpha-beta model says
// recursive_doubling on `hosts` ranks is no slower than the ring. Costs, with P the largest
// power of two up to H and f = 1 when H is not one (the fold and unfold rounds):
//   all_reduce:  ring 2(H-1)a_r + 2(H-1)/H S b;   log-step (log2 P + 2f)(a_l + S b)
//   reduce_scatter, all_gather: ring (H-1)a_r + (H-1)/H S b;
//                log-step (log2 P + 2f) a_l + ((P-1)/P + f (1 + 1/H)) S b
// a_r = 45.7 us and a_l = 30.4 us: each algorithm's all_reduce fitted on 2 and 3 emulated hosts
// (bench/between_hosts_model.py, docs/benchmarks.md "Between hosts: by size"). b: one for both,
// the ring's fitted 475 MB/s: both cross the same link, and the log-step fit's 639 MB/s would
// make its doubled bytes free at 4 hosts, where it measured 2.3-3.4x the ring's time from 256 KiB.
// Past 256 KiB the model no longer holds: at 8 hosts log-step reduce_scatter and all_gather,
// which it has equal to the ring but for latency, took 1.1-1.9x the ring's time at 2 MiB
// (0.6-1.4x at 256 KiB, 0.4-1.0x up to 32 KiB; docs/benchmarks.md), so the crossover stops there.
inline size_t logStepMaxBytes(Collective collective, int hosts) {
  constexpr double ringAlpha = 45.7e-6, logAlpha = 30.4e-6, beta = 1 / 475e6;
  constexpr size_t measuredUpTo = 256u << 10;
  if (hosts < 2) return 0;
  int p = 1, rounds = 0;
  while (p * 2 <= hosts) p *= 2, ++rounds;
  const double h = hosts, fold = p == hosts ? 0 : 1;
  rounds += 2 * static_cast<int>(fold);
  const bool allReduce = collective == Collective::AllReduce;
  const double ringFixed = (allReduce ? 2 : 1) * (h - 1) * ringAlpha;
  const double ringPerByte = (allReduce ? 2 : 1) * (h - 1) / h * beta;
  const double logFixed = rounds * logAlpha;
  const double logPerByte =
      allReduce ? rounds * beta : ((p - 1.0) / p + fold * (1 + 1 / h)) * beta;
  if (logFixed >= ringFixed) return 0;
  if (logPerByte <= ringPerByte) return measuredUpTo;
  const double crossover = (ringFixed - logFixed) / (logPerByte - ringPerByte);
  return std::min(measuredUpTo, static_cast<size_t>(crossover));
}

inline constexpr uint32_t kOneHopCollectives = collectiveBit(Collective::AllReduce) |
                                              collectiveBit(Collective::ReduceScatter) |
                                              collectiveBit(Collective::AllGather);
inline constexpr AlgorithmInfo kAlgorithms[] = {
    {Algorithm::Ring, "ring", plannedCollectives(), false, std::nullopt, nullptr},
    {Algorithm::OneShot, "one_shot", kOneHopCollectives, true, 8 * 1024, "all_reduce"},
    {Algorithm::TwoShot, "two_shot", collectiveBit(Collective::AllReduce), true, 128 * 1024,
     "all_reduce on 3 ranks or more; reduce_scatter and all_gather run one_shot, two_shot's "
     "halves, up to it"},
    {Algorithm::Auto, "auto", plannedCollectives(), false, std::nullopt, nullptr},
    {Algorithm::RecursiveDoubling, "recursive_doubling", kOneHopCollectives, false, kByHostCount,
     "all_reduce, reduce_scatter, all_gather on transports that reach every peer (TCP); by "
     "default the alpha-beta model's crossover for the number of ranks there"},
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
// recursive_doubling all_reduce, reduce_scatter and all_gather on those that reach every peer
// (`reachesEveryPeer`: Transport::reachesEveryPeer()), up to its threshold: the one set, else
// logStepMaxBytes for `worldSize` ranks. bench/tune.py asks this same function.
inline Algorithm chooseAlgorithm(Collective collective, size_t bytes, int worldSize,
                                 bool publications, const AlgorithmThresholds& thresholds,
                                 bool reachesEveryPeer = false) {
  if (worldSize == 1) return Algorithm::Ring;
  if (!publications) {
    if (!reachesEveryPeer || !algorithmPlans(Algorithm::RecursiveDoubling, collective))
      return Algorithm::Ring;
    const size_t set = thresholds[Algorithm::RecursiveDoubling];
    const size_t limit = set == kByHostCount ? logStepMaxBytes(collective, worldSize) : set;
    return bytes <= limit ? Algorithm::RecursiveDoubling : Algorithm::Ring;
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
