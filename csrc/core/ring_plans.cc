// The ring plans, for every collective (PlanBuilder, plan_builder.h). Index arithmetic follows
// one rule per family:
//   reduce-scatter / scatter: at ring step s rank r sends chunk r-1-s and receives chunk r-2-s,
//   all-gather / gather:      at ring step s rank r sends chunk r-s   and receives chunk r-1-s,
// so that rank r ends owning chunk r. A chunk received at ring step s is the one sent at step
// s+1, which is why one plan step both receives and forwards (NCCL's recvReduceSend).
#include "core/plan_builder.h"

namespace ringcomm {

Step& PlanBuilder::send(int chunk) {
  Step& step = add(chunk);
  step.sendTo = next_;
  return step;
}

Step& PlanBuilder::recv(int chunk, bool reduce, bool store) {
  Step& step = add(chunk);
  step.recvFrom = prev_;
  step.reduce = reduce;
  step.store = store;
  step.finalize = reduce && store;
  return step;
}

Step& PlanBuilder::recvSend(int chunk, bool reduce, bool store) {
  Step& step = recv(chunk, reduce, store);
  step.sendTo = next_;
  return step;
}

void PlanBuilder::ackSend() {
  Step& step = add(kWhole);
  step.range.count = 0;
  step.sendTo = next_;
  step.ack = true;
}

void PlanBuilder::ackRecv() {
  Step& step = add(kWhole);
  step.range.count = 0;
  step.recvFrom = prev_;
  step.ack = true;
}

// Reduce-scatter: rank r ends with chunk r fully reduced; `forwardLast` also sends it on,
// which is the first all-gather step of an allreduce.
void PlanBuilder::reduceScatter(bool forwardLast) {
  send(rank_ - 1);
  for (int s = 1; s <= size_ - 2; ++s) recvSend(rank_ - 1 - s, /*reduce=*/true, /*store=*/false);
  if (forwardLast)
    recvSend(rank_, /*reduce=*/true, /*store=*/true);
  else
    recv(rank_, /*reduce=*/true, /*store=*/true);
}

// All-gather after rank r holds chunk r; `sendOwn` is false when reduce-scatter already sent it.
void PlanBuilder::allGather(bool sendOwn) {
  if (sendOwn) send(rank_);
  for (int s = 1; s <= size_ - 2; ++s) recvSend(rank_ - s, /*reduce=*/false, /*store=*/true);
  recv(rank_ + 1, /*reduce=*/false, /*store=*/true);
}

void PlanBuilder::broadcast() {
  int p = distanceFromRoot();
  if (p == 0) {
    send(kWhole);
    ackRecv();
  } else if (p < size_ - 1) {
    recvSend(kWhole, /*reduce=*/false, /*store=*/true);
  } else {
    recv(kWhole, /*reduce=*/false, /*store=*/true);
    ackSend();
  }
}

// The chain runs root+1 -> root+2 -> ... -> root; only the root stores the result.
void PlanBuilder::reduce() {
  int p = distanceFromRoot();
  if (p == 1) {
    send(kWhole);
    ackRecv();
  } else if (p > 1) {
    recvSend(kWhole, /*reduce=*/true, /*store=*/false);
  } else {
    recv(kWhole, /*reduce=*/true, /*store=*/true);
    ackSend();
  }
}

// All-gather truncated: a rank forwards only what lies between it and the root.
void PlanBuilder::gather() {
  int p = distanceFromRoot();
  if (p == 0) {
    for (int s = 0; s <= size_ - 2; ++s) recv(rank_ - 1 - s, /*reduce=*/false, /*store=*/true);
    ackSend();
    return;
  }
  send(rank_);
  for (int s = 1; s <= p - 1; ++s) recvSend(rank_ - s, /*reduce=*/false, /*store=*/false);
  if (p == 1) ackRecv();
}

// Reduce-scatter's indices without reduction: the root sends the farthest chunk first.
void PlanBuilder::scatter() {
  int p = distanceFromRoot();
  if (p == 0) {
    for (int s = 0; s <= size_ - 2; ++s) send(rank_ - 1 - s);
    ackRecv();
    return;
  }
  for (int s = p - 1; s <= size_ - 3; ++s)
    recvSend(rank_ - 2 - s, /*reduce=*/false, /*store=*/false);
  recv(rank_, /*reduce=*/false, /*store=*/true);
  if (p == size_ - 1) ackSend();
}

}  // namespace ringcomm
