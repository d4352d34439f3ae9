// Which NCCL group each point-to-point operation of a ring goes into. Pure bookkeeping, no CUDA:
// NcclTransport issues what it decides, and the CPU tests replay it for every plan
// (traceGroups below) to check that the groups match up between ranks and cannot deadlock.
// Publications (publications.h) go out as one group of their own, after the queued sends.
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

#include "cuda/publications.h"
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

// One rank's NCCL groups for a collective, as NcclTransport would issue them, from the real
// executor and plan without a GPU. An operation is (is_send, peer, bytes, message number):
// message numbers count each rank's sends (and receives) in order, so partners carry the same
// number.
struct TracedOp {
  bool send = false;
  int peer = -1;
  size_t bytes = 0;
  uint64_t message = 0;
  bool staged = false;  // through a staging slot (else the caller's buffer)
  int64_t area = -1;    // a publication's exchange: its area in the staging buffer
};

// A publication event, in the order the rank runs it: a group (index into `groups`), this
// rank writing its own publication, or a read of `peer`'s (round numbers count from 0).
struct TracedEvent {
  enum Kind { Group, Write, Read } kind = Group;
  size_t group = 0;
  int peer = -1;
  int phase = -1;
  uint64_t round = 0;
  size_t area = 0;
  size_t bytes = 0;
};

class GroupTrace : public Transport, public Reducer {
 public:
  GroupTrace(int slots, size_t slotBytes, int rank = 0, int worldSize = 1, size_t publishBytes = 0)
      : queue_(slots), slotBytes_(slotBytes), slots_(slots),
        publications_(rank, worldSize, publishBytes) {}

  std::vector<std::vector<TracedOp>> groups;
  std::vector<TracedEvent> events;  // groups, publication writes and reads, in order
  size_t stagingBytes() const { return publications_.stagingBytes(); }
  uint64_t rounds() const { return publications_.rounds(); }

  size_t maxMessageBytes() const override { return slotBytes_; }
  size_t columnsPerWave() const override { return GroupQueue::columnsPerWave(slots_); }
  bool movesUserBuffers() const override { return true; }
  void* acquireSend(int, size_t) override {
    bool mustFlush = false;
    slot_ = queue_.nextSlot(mustFlush);
    if (mustFlush) flush();
    return &scratch_;
  }
  void commitSend(int peer, const Envelope& e) override {
    if (queue_.push(QueuedSend{sends_++, peer, static_cast<size_t>(e.bytes), slot_, nullptr}))
      flush();
  }
  void sendFrom(int peer, const void* src, const Envelope& e) override {
    if (queue_.push(QueuedSend{sends_++, peer, static_cast<size_t>(e.bytes), -1, src})) flush();
  }
  const void* acquireRecv(int peer, const Envelope& e) override {
    receive(peer, e, true);
    return &scratch_;
  }
  void recvInto(int peer, void*, const Envelope& e) override { receive(peer, e, false); }
  void releaseRecv(int) override {}
  void abort(const std::string&) override {}
  void end() override {
    publications_.finishRound();
    flush();
  }

  size_t publishBytes() const override { return publications_.bytes(); }
  void* acquirePublish(int phase, size_t bytes) override {
    published_ = publications_.acquire(phase, bytes);
    return &scratch_;
  }
  void commitPublish(int phase, const Envelope& e) override {
    publications_.commit(phase, e);
    events.push_back({TracedEvent::Write, 0, -1, phase, publications_.rounds() - 1, published_,
                      static_cast<size_t>(e.bytes)});
  }
  void expectPublished(int phase, const std::vector<size_t>& bytesPerRank) override {
    publications_.expect(phase, bytesPerRank);
  }
  const void* acquirePublished(int peer, int phase, const Envelope& e) override {
    std::vector<PublishOp> exchange;
    const size_t area = publications_.read(peer, phase, e, exchange);
    if (!exchange.empty()) {
      flush();  // as NcclTransport: queued sends leave first
      std::vector<TracedOp> group;
      for (const PublishOp& op : exchange)
        group.push_back({op.send, op.peer, op.bytes, op.send ? sends_++ : receives_++, true,
                         static_cast<int64_t>(op.offset)});
      record(group);
    }
    events.push_back({TracedEvent::Read, 0, peer, phase, publications_.rounds() - 1, area,
                      static_cast<size_t>(e.bytes)});
    return &scratch_;
  }

  void reduce(void*, void*, const void*, const void*, size_t, const ReduceSpec&, bool) override {}
  void copy(void*, void*, const void*, size_t) override {}
  void convert(void*, void*, const void*, bool, size_t, const ReduceSpec&) override {}

 private:
  void receive(int peer, const Envelope& e, bool staged) {
    std::vector<TracedOp> group;
    for (const QueuedSend& s : queue_.forReceive())
      group.push_back({true, s.peer, s.bytes, s.id, s.slot >= 0});
    group.push_back({false, peer, static_cast<size_t>(e.bytes), receives_++, staged});
    record(group);
  }
  void flush() {
    std::vector<TracedOp> group;
    for (const QueuedSend& s : queue_.takeAll())
      group.push_back({true, s.peer, s.bytes, s.id, s.slot >= 0});
    if (!group.empty()) record(group);
  }
  void record(const std::vector<TracedOp>& group) {
    events.push_back({TracedEvent::Group, groups.size()});
    groups.push_back(group);
  }

  GroupQueue queue_;
  size_t slotBytes_;
  int slots_;
  int slot_ = -1;
  uint64_t sends_ = 0, receives_ = 0;
  Publications publications_;
  size_t published_ = 0;
  char scratch_[16] = {};
};

// Runs rank `request.rank`'s plan through `trace` (buffers are fake: nothing is read).
inline void runTrace(GroupTrace& trace, const PlanRequest& request, DataType type,
                     size_t slotBytes) {
  Collective c;
  c.plan = makePlan(request);
  c.spec = ReduceSpec{type, RedOp::Sum, request.worldSize, type};
  static char fake[1];
  const size_t all = c.plan.bufferCount + request.count * request.worldSize;
  c.input = c.output = BufferView{fake, 0, all};
  if (request.worldSize > 1) Executor(trace, trace, slotBytes).run(c);
  trace.end();
}

// The groups rank `rank` issues for one collective.
inline std::vector<std::vector<TracedOp>> traceGroups(const PlanRequest& request, DataType type,
                                                      int slots, size_t slotBytes) {
  GroupTrace trace(slots, slotBytes, request.rank, request.worldSize);
  runTrace(trace, request, type, slotBytes);
  return trace.groups;
}

}  // namespace ringcomm
