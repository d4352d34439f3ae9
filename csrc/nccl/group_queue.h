// Which NCCL group each point-to-point operation of a ring goes into. Pure bookkeeping, no CUDA:
// NcclTransport issues what it decides. The CPU tests run every plan through the transport over
// a host implementation of NCCL's pairing and blocking (csrc/testing/cuda/host_gpu.h), where
// groups that did not match up would deadlock and time out.
// Publications (publications.h) go out as one group of their own, after the queued sends, and
// so does a point-to-point batch (NcclTransport::sendRecvBatch).
//
// The rule. Sends wait in a queue, in order. Every receive goes out in one group with the
// OLDEST queued send, if any (ncclGroupStart; send; recv; ncclGroupEnd). Sends go out alone,
// all queued ones as one group, only when the queue is full, when the next staging slot still
// holds a queued send, or when the collective ends.
//
// Why it pipelines. In the symmetric plans (all_reduce, reduce_scatter, all_gather) every rank
// sends and receives the same sequence, so rank r's g-th group holds its g-th send and g-th
// receive, and its partners sit in the neighbours' g-th groups. The executor runs W slice
// columns per wave, so the g-th send was produced from receive g-W: group g waits only for the
// kernel W receives back, and that kernel overlaps the transfers in between.
//
// Why it cannot deadlock. Give every message the time of a lock-step ring (a message received
// at time t is forwarded at time t+1; a root's messages leave at 0, 1, 2, ...). A group holds
// one receive of time t and sends of times below t, or only sends; every earlier group of the
// rank holds smaller times, so by induction over time every operation's partner is enqueued
// behind finished work only. Operations inside one group progress independently, so a
// sends-only group needs nothing but its partners being enqueued.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <vector>

#include "nccl/publications.h"
#include "ringcomm/executor.h"
#include "ringcomm/reducer.h"
#include "ringcomm/schedule.h"
#include "ringcomm/transport.h"

namespace ringcomm {

struct QueuedSend {
  uint64_t id = 0;            // the transport's number for it (readiness event)
  int peer = -1;
  size_t bytes = 0;
  int slot = -1;              // staging slot, or -1: straight from the caller's buffer
  const void* src = nullptr;  // the caller's buffer when slot < 0
};

class GroupQueue {
 public:
  // With `slots` staging slots per direction the executor runs slots/2 columns per wave, so at
  // most slots/2 sends wait in a symmetric plan; the queue holds one more before it goes out
  // alone, which only roots and chains ever reach.
  explicit GroupQueue(int slots) : slots_(slots), maxQueued_(static_cast<size_t>(slots / 2 + 1)) {}
  static size_t columnsPerWave(int slots) { return static_cast<size_t>(slots / 2); }

  // The staging slot for the next send, round robin. `mustFlush` is set when that slot still
  // holds a queued send: the queue has to go out before the slot is written again.
  int nextSlot(bool& mustFlush) {
    const int slot = static_cast<int>(sendsStaged_++ % static_cast<uint64_t>(slots_));
    mustFlush = false;
    for (const QueuedSend& q : queue_) mustFlush = mustFlush || q.slot == slot;
    return slot;
  }
  // Queues a send; true when the queue is now full and must go out.
  bool push(const QueuedSend& send) {
    queue_.push_back(send);
    return queue_.size() >= maxQueued_;
  }
  // What goes into a receive's group: the oldest queued send, or nothing.
  std::vector<QueuedSend> forReceive() {
    if (queue_.empty()) return {};
    QueuedSend oldest = queue_.front();
    queue_.pop_front();
    return {oldest};
  }
  std::vector<QueuedSend> takeAll() {
    std::vector<QueuedSend> all(queue_.begin(), queue_.end());
    queue_.clear();
    return all;
  }
  const std::deque<QueuedSend>& queued() const { return queue_; }

 private:
  int slots_;
  size_t maxQueued_;
  uint64_t sendsStaged_ = 0;
  std::deque<QueuedSend> queue_;
};

}  // namespace ringcomm
