// NcclTransport's data path as the executor meets it: staging slots acquired and released, sends
// queued, receives and publications read. The NCCL groups these post are in nccl_groups.cc,
// begin() and end() in nccl_bracket.cc, the life cycle and watchdog in nccl_lifecycle.cc. Which
// operations share an NCCL group, and why that neither deadlocks nor serializes, is explained in
// group_queue.h; the events below order the two streams per slot:
//   send slot s:  compute writes it (kernel)      -> sendReady[id] -> the group that sends it
//                 that group                      -> sendFree[s]   -> the next kernel writing s
//   recv slot s:  the group that receives into it -> recvReady[s]  -> the kernel reading it
//                 that kernel                     -> recvFree[s]   -> the next group filling s
//   user buffers: a group receiving into them waits for all compute so far (kernels may read
//                 the old bytes), and later compute waits for it.
#include "nccl/nccl_transport.h"

#include "ringcomm/error.h"

namespace ringcomm {
namespace {

bool overlaps(const void* a, size_t aBytes, const void* b, size_t bBytes) {
  auto x = reinterpret_cast<uintptr_t>(a), y = reinterpret_cast<uintptr_t>(b);
  return x < y + bBytes && y < x + aBytes;
}

}  // namespace

#define RC_GPU(call) check(api_->call, #call)

void* NcclTransport::acquireSend(int peer, size_t bytes) {
  checkUsable();
  RC_CHECK(peer >= 0 && peer < options_.worldSize, "send to rank ", peer, " outside the world");
  RC_CHECK(bytes <= options_.slotBytes, "a ", bytes, "-byte message exceeds the ",
           options_.slotBytes, "-byte NCCL staging slot");
  bool mustFlush = false;
  const int slot = queue_.nextSlot(mustFlush);
  if (mustFlush) flush();
  if (sendFreePending_[slot]) {
    RC_GPU(cudaStreamWaitEvent(compute_, sendFree_[slot], 0));
    sendFreePending_[slot] = false;
  }
  stagedSlot_ = slot;
  return sendSlot(slot);
}

void NcclTransport::commitSend(int peer, const Envelope& envelope) {
  RC_CHECK(stagedSlot_ >= 0, "commitSend without acquireSend");
  const int slot = stagedSlot_;
  stagedSlot_ = -1;
  queueSend(QueuedSend{sendCount_, peer, static_cast<size_t>(envelope.bytes), slot, nullptr});
}

void NcclTransport::sendFrom(int peer, const void* src, const Envelope& envelope) {
  checkUsable();
  RC_CHECK(peer >= 0 && peer < options_.worldSize, "send to rank ", peer, " outside the world");
  queueSend(QueuedSend{sendCount_, peer, static_cast<size_t>(envelope.bytes), -1, src});
}

// The send's data is whatever compute (or the caller's stream, or an earlier group) wrote so
// far: its readiness event is recorded on compute now.
void NcclTransport::queueSend(const QueuedSend& send) {
  RC_GPU(cudaEventRecord(sendReady(send.id), compute_));
  ++sendCount_;
  if (queue_.push(send)) flush();
}

const void* NcclTransport::acquireRecv(int peer, const Envelope& expected) {
  checkUsable();
  RC_CHECK(peer >= 0 && peer < options_.worldSize, "receive from rank ", peer,
           " outside the world");
  RC_CHECK(expected.bytes <= options_.slotBytes, "a ", expected.bytes,
           "-byte message exceeds the ", options_.slotBytes, "-byte NCCL staging slot");
  RC_CHECK(heldRecvSlot_ < 0, "a receive slot is still held (releaseRecv missing)");
  const int slot = static_cast<int>(recvCount_++ % static_cast<uint64_t>(options_.slots));
  Receive receive{peer, recvSlot(slot), static_cast<size_t>(expected.bytes), slot};
  issue(queue_.forReceive(), &receive);
  heldRecvSlot_ = slot;
  return recvSlot(slot);
}

void NcclTransport::releaseRecv(int /*peer*/) {
  RC_CHECK(heldRecvSlot_ >= 0, "releaseRecv without acquireRecv");
  RC_GPU(cudaEventRecord(recvFree_[heldRecvSlot_], compute_));
  recvFreePending_[heldRecvSlot_] = true;
  heldRecvSlot_ = -1;
}

void NcclTransport::recvInto(int peer, void* dst, const Envelope& expected) {
  checkUsable();
  RC_CHECK(peer >= 0 && peer < options_.worldSize, "receive from rank ", peer,
           " outside the world");
  const size_t bytes = static_cast<size_t>(expected.bytes);
  // A queued send still to read these bytes goes out first.
  for (const QueuedSend& q : queue_.queued())
    if (q.slot < 0 && overlaps(q.src, q.bytes, dst, bytes)) {
      flush();
      break;
    }
  ++recvCount_;
  Receive receive{peer, dst, bytes, -1};
  issue(queue_.forReceive(), &receive);
}

// -- publications (see publications.h; their exchange and its events: nccl_groups.cc) ----------

void* NcclTransport::acquirePublish(int phase, size_t bytes) {
  checkUsable();
  return staging_ + publications_.acquire(phase, bytes);
}

void NcclTransport::commitPublish(int phase, const Envelope& envelope) {
  publications_.commit(phase, envelope);
}

const void* NcclTransport::acquirePublished(int peer, int phase, const Envelope& expected) {
  checkUsable();
  std::vector<PublishOp> ops;
  const size_t area = publications_.read(peer, phase, expected, ops);
  if (!ops.empty()) exchange(ops, phase);
  return staging_ + area;
}

}  // namespace ringcomm
