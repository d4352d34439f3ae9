// PlanBuilder: appends one rank's steps to a Plan (schedule.h). makePlan (schedule.cc) lays out
// the chunks and calls one family: the ring plans are in ring_plans.cc, the one-hop plans, which
// exchange publications, in one_hop_plans.cc, the log-depth ones in recursive_doubling_plans.cc. Private to the core.
#pragma once

#include <limits>

#include "ringcomm/schedule.h"

namespace ringcomm {

class PlanBuilder {
 public:
  explicit PlanBuilder(Plan& plan)
      : plan_(plan),
        rank_(plan.request.rank),
        size_(plan.request.worldSize),
        prev_(wrap(rank_ - 1, size_)),
        next_(wrap(rank_ + 1, size_)) {}

  // Ring plans (ring_plans.cc).
  void reduceScatter(bool forwardLast);
  void allGather(bool sendOwn);
  void broadcast();
  void reduce();
  void gather();
  void scatter();

  // One-hop plans (one_hop_plans.cc).
  void oneShotAllReduce();
  void twoShotAllReduce();
  void oneShotReduceScatter();
  void oneShotAllGather();

  // Log-depth plans between hosts (recursive_doubling_plans.cc).
  void recursiveDoublingAllReduce();
  // reduce_scatter by recursive halving, all_gather by recursive doubling (log_step_plans.cc).
  void recursiveHalvingReduceScatter();
  void recursiveDoublingAllGather();

 private:
  static int wrap(int value, int n) { return ((value % n) + n) % n; }

  // Stands for "the whole buffer" where a step index would name a chunk (chain collectives).
  static constexpr int kWhole = std::numeric_limits<int>::min();

  // Adds a step on chunk `chunk` (taken modulo the world size), or on the whole buffer.
  Step& add(int chunk) {
    Step step;
    step.chunk = chunk == kWhole ? -1 : wrap(chunk, size_);
    step.range = chunk == kWhole ? Range{0, plan_.bufferCount} : plan_.chunks[step.chunk];
    plan_.steps.push_back(step);
    return plan_.steps.back();
  }

  // Ring steps (ring_plans.cc): to the next rank, from the previous one.
  Step& send(int chunk);
  Step& recv(int chunk, bool reduce, bool store);
  Step& recvSend(int chunk, bool reduce, bool store);
  // The ring-closing acknowledgement: from the chain's last rank to its first.
  void ackSend();
  void ackRecv();
  // Position along the ring counted from the root.
  int distanceFromRoot() const { return wrap(rank_ - plan_.request.root, size_); }

  // One-hop steps (one_hop_plans.cc): publish a chunk (or kWhole: every chunk) in `phase`; read
  // rank `from`'s publication of `publishedChunk` in `phase`, keeping chunk `chunk` of it.
  Step& publish(int chunk, int phase);
  Step& read(int from, int phase, int publishedChunk, int chunk, bool reduce);
  // Reduces chunk `chunk` (kWhole for the whole buffer) from every rank's phase-0 publication
  // of every chunk, in rank order; returns the last step (it finalizes).
  Step& reduceFromAll(int chunk);
  // Every other rank's chunk, from its publication of it in `phase`.
  void copyFromOthers(int phase);

  // Point-to-point steps on the whole buffer (recursive_doubling_plans.cc): to or from any rank.
  Step& sendWholeTo(int peer);
  Step& recvWholeFrom(int peer, bool reduce);
  // Point-to-point steps on the blocks [first, first + count) (log_step_plans.cc).
  Step& sendBlocksTo(int peer, int first, int count);
  Step& recvBlocksFrom(int peer, int first, int count, bool reduce);
  Step& blocks(int first, int count);

  Plan& plan_;
  int rank_, size_, prev_, next_;
};

}  // namespace ringcomm
