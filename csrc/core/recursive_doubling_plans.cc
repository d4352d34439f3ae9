// The recursive_doubling all_reduce plan (PlanBuilder, plan_builder.h): log-depth, for small
// tensors over a transport that reaches every peer. With P the largest power of two up to N:
//   ranks P..N-1 send their tensor to rank r-P, which reduces it in first (the fold);
//   ranks 0..P-1, for k = 0..log2(P)-1, send their running result to r xor 2^k and reduce
//   what comes back (both sides combine the same two values: op(a, b) == op(b, a), bit for bit);
//   ranks 0..N-P-1 then send the result to rank r+P, which keeps it (the unfold).
// Every step moves the whole tensor: a send goes out before the matching receive is waited on,
// which a transport whose sends wait only for free slots (TCP's) cannot deadlock on.
#include "core/plan_builder.h"

namespace ringcomm {

Step& PlanBuilder::sendWholeTo(int peer) {
  Step& step = add(kWhole);
  step.sendTo = peer;
  return step;
}

Step& PlanBuilder::recvWholeFrom(int peer, bool reduce) {
  Step& step = add(kWhole);
  step.recvFrom = peer;
  step.reduce = reduce;
  step.store = true;
  return step;
}

void PlanBuilder::recursiveDoublingAllReduce() {
  int powerOfTwo = 1;
  while (powerOfTwo * 2 <= size_) powerOfTwo *= 2;
  const int extra = size_ - powerOfTwo;
  if (rank_ >= powerOfTwo) {  // folded in: hand the input over, get the result back
    sendWholeTo(rank_ - powerOfTwo);
    recvWholeFrom(rank_ - powerOfTwo, /*reduce=*/false);
    return;
  }
  Step* last = nullptr;  // the last reduction finalizes (AVG divides once)
  if (rank_ < extra) last = &recvWholeFrom(rank_ + powerOfTwo, /*reduce=*/true);
  for (int distance = 1; distance < powerOfTwo; distance *= 2) {
    sendWholeTo(rank_ ^ distance);
    last = &recvWholeFrom(rank_ ^ distance, /*reduce=*/true);
  }
  if (last != nullptr) last->finalize = true;
  if (rank_ < extra) sendWholeTo(rank_ + powerOfTwo);
}

}  // namespace ringcomm
