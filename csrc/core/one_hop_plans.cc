// The one-hop plans (PlanBuilder, plan_builder.h; what each does is in schedule.h). They read
// publications in rank order 0..N-1 wherever they reduce, so every rank combines the same
// values in the same order.
#include "core/plan_builder.h"

namespace ringcomm {

Step& PlanBuilder::publish(int chunk, int phase) {
  Step& step = add(chunk);
  step.publishPhase = phase;
  return step;
}

Step& PlanBuilder::read(int from, int phase, int publishedChunk, int chunk, bool reduce) {
  Step& step = add(chunk);
  step.readFrom = from;
  step.readPhase = phase;
  step.publishedChunk = publishedChunk == kWhole ? -1 : publishedChunk;
  step.reduce = reduce;
  step.store = true;
  return step;
}

Step& PlanBuilder::reduceFromAll(int chunk) {
  for (int q = 0; q < size_ - 1; ++q) read(q, 0, kWhole, chunk, /*reduce=*/q > 0);
  Step& last = read(size_ - 1, 0, kWhole, chunk, /*reduce=*/true);
  last.finalize = true;
  return last;
}

void PlanBuilder::oneShotAllReduce() {
  publish(kWhole, 0);
  reduceFromAll(kWhole);
}

void PlanBuilder::twoShotAllReduce() {
  publish(kWhole, 0);
  reduceFromAll(rank_).publishPhase = 1;
  copyFromOthers(1);
}

void PlanBuilder::oneShotReduceScatter() {
  publish(kWhole, 0);
  reduceFromAll(rank_);
}

void PlanBuilder::oneShotAllGather() {
  publish(rank_, 0);
  copyFromOthers(0);
}

void PlanBuilder::copyFromOthers(int phase) {
  for (int q = 0; q < size_; ++q)
    if (q != rank_) read(q, phase, q, q, /*reduce=*/false);
}

}  // namespace ringcomm
