// Log-step reduce_scatter (recursive halving) and all_gather (recursive doubling) between hosts
// (PlanBuilder, plan_builder.h), for transports that reach every peer. With P the largest power
// of two up to N and E = N - P, the odd ranks below 2E fold into the even rank below them, which
// then stands for both blocks; the others stand for their own. Folding pairs of neighbours (not
// rank r into r - P, as all_reduce does) keeps each of the P stand-ins' blocks, and so every
// set of blocks a round moves, contiguous: one message per round and slice column. Bruck's
// all_gather needs no fold, but its rotated blocks wrap around the buffer and its reduce_scatter
// twin does not follow from the same layout.
//   reduce_scatter: a folded rank sends every block to its pair, which reduces them in; then for
//     distance d = P/2 .. 1 the stand-ins send the half of their blocks the partner at stand-in
//     distance d keeps and reduce in the other half; a pair's block goes back to it last.
//   all_gather: the reverse: a folded rank's block to its pair; for d = 1 .. P/2 each stand-in
//     sends every block it holds and receives the partner's; the whole output to the pair last.
// Sends go out before the matching receive is waited on, as in recursive_doubling_plans.cc.
#include <algorithm>

#include "core/plan_builder.h"
#include "ringcomm/error.h"

namespace ringcomm {
namespace {

// Ranks and blocks as the P stand-ins see them.
struct Folding {
  explicit Folding(int n) : size(n) {
    while (powerOfTwo * 2 <= n) powerOfTwo *= 2;
    extra = n - powerOfTwo;
  }
  bool folded(int rank) const { return rank < 2 * extra && rank % 2 == 1; }
  int standIn(int rank) const { return rank < 2 * extra ? rank / 2 : rank - extra; }
  // First block of stand-in v (also its rank); stand-in P's is N, so [first(v), first(w)) are
  // the blocks of stand-ins v..w-1.
  int first(int v) const { return v < extra ? 2 * v : v + extra; }
  // The most blocks one step moves on any rank: all of them in the fold (or the unfold), else
  // half of them in the first round of halving (the last of doubling).
  int mostBlocks() const { return extra > 0 ? size : std::max(1, size / 2); }
  int size, powerOfTwo = 1, extra = 0;
};

}  // namespace

Step& PlanBuilder::blocks(int first, int count) {
  RC_CHECK(static_cast<size_t>(count) <= plan_.packedChunks, "a step of ", count,
           " blocks in a plan whose messages pack ", plan_.packedChunks);
  Step& step = add(first);
  step.span = count;
  step.range.count = 0;
  for (int b = first; b < first + count; ++b) step.range.count += plan_.chunks[b].count;
  return step;
}

Step& PlanBuilder::sendBlocksTo(int peer, int first, int count) {
  Step& step = blocks(first, count);
  step.sendTo = peer;
  return step;
}

Step& PlanBuilder::recvBlocksFrom(int peer, int first, int count, bool reduce) {
  Step& step = blocks(first, count);
  step.recvFrom = peer;
  step.reduce = reduce;
  step.store = true;
  return step;
}

void PlanBuilder::recursiveHalvingReduceScatter() {
  const Folding f(size_);
  plan_.packedChunks = f.mostBlocks();
  if (f.folded(rank_)) {  // hand every block to the pair, get this one back reduced
    sendBlocksTo(rank_ - 1, 0, size_);
    recvBlocksFrom(rank_ - 1, rank_, 1, /*reduce=*/false);
    return;
  }
  const int v = f.standIn(rank_);
  const bool paired = v < f.extra;
  if (paired) recvBlocksFrom(rank_ + 1, 0, size_, /*reduce=*/true);
  int low = 0;  // the stand-ins whose blocks this rank still reduces: [low, low + 2d)
  Step* last = nullptr;
  for (int d = f.powerOfTwo / 2; d >= 1; d /= 2) {
    const int partner = v ^ d;
    const int keep = (v & d) ? low + d : low, give = (v & d) ? low : low + d;
    sendBlocksTo(f.first(partner), f.first(give), f.first(give + d) - f.first(give));
    last = &recvBlocksFrom(f.first(partner), f.first(keep), f.first(keep + d) - f.first(keep),
                           /*reduce=*/true);
    low = keep;
  }
  last->finalize = true;  // the last reduction of this rank's blocks (AVG divides once)
  if (paired) sendBlocksTo(rank_ + 1, rank_ + 1, 1);
}

void PlanBuilder::recursiveDoublingAllGather() {
  const Folding f(size_);
  plan_.packedChunks = f.mostBlocks();
  if (f.folded(rank_)) {  // hand this block to the pair, get every block back
    sendBlocksTo(rank_ - 1, rank_, 1);
    recvBlocksFrom(rank_ - 1, 0, size_, /*reduce=*/false);
    return;
  }
  const int v = f.standIn(rank_);
  const bool paired = v < f.extra;
  if (paired) recvBlocksFrom(rank_ + 1, rank_ + 1, 1, /*reduce=*/false);
  int low = v;  // the stand-ins whose blocks this rank holds: [low, low + d)
  for (int d = 1; d < f.powerOfTwo; d *= 2) {
    const int partner = v ^ d, theirs = low ^ d;
    sendBlocksTo(f.first(partner), f.first(low), f.first(low + d) - f.first(low));
    recvBlocksFrom(f.first(partner), f.first(theirs), f.first(theirs + d) - f.first(theirs),
                   /*reduce=*/false);
    low = std::min(low, theirs);
  }
  if (paired) sendBlocksTo(rank_ + 1, 0, size_);
}

}  // namespace ringcomm
