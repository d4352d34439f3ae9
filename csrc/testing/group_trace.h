// Test-only: one rank's NCCL groups for a collective, as NcclTransport decides them (GroupQueue,
// publications.h), recorded from the real executor and plan without a GPU, for the CPU
// replays in tests/test_gpu_host.py (through _C.testing).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "cuda/group_queue.h"

namespace ringcomm {

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
