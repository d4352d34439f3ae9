// NcclTransport's data path (its life cycle and watchdog are in nccl_lifecycle.cc). Which
// operations share an NCCL group, and why that neither deadlocks nor serializes, is explained in
// group_queue.h; the events below order the two streams per slot:
//   send slot s:  compute writes it (kernel)      -> sendReady[id] -> the group that sends it
//                 that group                      -> sendFree[s]   -> the next kernel writing s
//   recv slot s:  the group that receives into it -> recvReady[s]  -> the kernel reading it
//                 that kernel                     -> recvFree[s]   -> the next group filling s
//   user buffers: a group receiving into them waits for all compute so far (kernels may read
//                 the old bytes), and later compute waits for it.
#include "nccl/nccl_transport.h"

#include <algorithm>

#include "ringcomm/error.h"

namespace ringcomm {
namespace {

using Clock = std::chrono::steady_clock;

bool overlaps(const void* a, size_t aBytes, const void* b, size_t bBytes) {
  auto x = reinterpret_cast<uintptr_t>(a), y = reinterpret_cast<uintptr_t>(b);
  return x < y + bBytes && y < x + aBytes;
}

}  // namespace

#define RC_GPU(call) check(api_->call, #call)

void NcclTransport::begin(uintptr_t stream, const CallName& call) {
  checkUsable();
  call_ = call, watched_ = false;
  caller_ = reinterpret_cast<cudaStream_t>(stream);
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  RC_GPU(cudaStreamIsCapturing(caller_, &status));
  bool capturing = status == cudaStreamCaptureStatusActive;
  // First-time work (connecting to peers through NCCL, which allocates and waits for them)
  // cannot be part of a capture: a collective must have run once outside it.
  if (capturing && eagerCollectives_ == 0)
    RC_THROW_AS(RefusedError, "a CUDA graph capture cannot hold the first collective of a "
                "ringcomm communicator (NCCL connects to its peers then): run the collective "
                "once before capturing, as a warm-up", where());
  RC_GPU(cudaGetDevice(&callerDevice_));
  if (callerDevice_ != options_.device) RC_GPU(cudaSetDevice(options_.device));
  inCollective_ = true;
  if (!capturing && call.replay != nullptr && shouldRecord(*call.replay)) {
    // Recorded on a stream of its own (this thread's capture only); end() launches the graph
    // on the caller's stream, so this call runs as every later one will.
    RC_GPU(cudaStreamBeginCapture(recordStream_, cudaStreamCaptureModeThreadLocal));
    recording_ = true;
    recordingKey_ = *call.replay;
    recordingFor_ = caller_;
    caller_ = recordStream_;
    capturing = true;
  }
  if (capturing || capturing_) {
    // Events recorded inside a capture cannot be waited on outside it, nor the reverse: slot
    // reuse across that boundary is ordered by the timeline event instead.
    std::fill(sendFreePending_.begin(), sendFreePending_.end(), false);
    std::fill(recvFreePending_.begin(), recvFreePending_.end(), false);
  }
  capturing_ = capturing;
  // Collectives of one communicator run one after another in the order they were launched,
  // eager or replayed from a graph on any stream: they share the staging slots, and NCCL pairs
  // operations by their order. A captured collective waits, at each replay, for the timeline's
  // latest record (an external event node).
  if (capturing)
    RC_GPU(cudaStreamWaitEvent(caller_, timeline_, cudaEventWaitExternal));
  RC_GPU(cudaEventRecord(callerReady_, caller_));
  RC_GPU(cudaStreamWaitEvent(compute_, callerReady_, 0));
  RC_GPU(cudaStreamWaitEvent(commStream_, callerReady_, 0));
  if (!capturing) {
    RC_GPU(cudaStreamWaitEvent(compute_, timeline_, 0));
    RC_GPU(cudaStreamWaitEvent(commStream_, timeline_, 0));
  }
  heldRecvSlot_ = -1;
}

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

// A batch is one group: NCCL posts its operations together, so a send and its receive never
// wait for each other's group, whatever order the ranks list them in (two ranks that both
// send first would otherwise both wait for the other's receive: at the first exchange, which
// connects, and for messages larger than NCCL's buffers).
void NcclTransport::sendRecvBatch(const std::vector<DirectMessage>& messages) {
  checkUsable();
  bool any = false;  // zero-byte messages are skipped on both sides alike, as in issue()
  for (const DirectMessage& m : messages) {
    RC_CHECK(m.peer >= 0 && m.peer < options_.worldSize, m.send ? "send to" : "receive from",
             " rank ", m.peer, " outside the world");
    any = any || m.bytes > 0;
  }
  if (!any) return;
  flush();  // sends queued before the batch go out first: pairs keep their order
  // The group reads and writes the caller's buffers: after all compute so far (kernels may
  // still write what it sends or read what it overwrites), and later compute after it.
  RC_GPU(cudaEventRecord(computeAll_, compute_));
  RC_GPU(cudaStreamWaitEvent(commStream_, computeAll_, 0));
  std::vector<int> peers;
  for (const DirectMessage& m : messages)
    if (m.bytes > 0) peers.push_back(m.peer);
  runGroup(
      peers,
      [&](ncclComm_t comm) {
        for (const DirectMessage& m : messages) {
          if (m.bytes == 0) continue;
          const ncclResult_t rc =
              m.send ? api_->ncclSend(m.data, m.bytes, ncclInt8, m.peer, comm, commStream_)
                     : api_->ncclRecv(m.data, m.bytes, ncclInt8, m.peer, comm, commStream_);
          if (!ncclPosted(rc)) return rc;
        }
        return ncclSuccess;
      },
      [&] {
        std::string what = detail::concat("exchanging a batch of ", messages.size(), " messages (");
        size_t named = 0;
        for (const DirectMessage& m : messages)
          if (m.bytes > 0 && named++ < 8)
            what += detail::concat(m.send ? "send to rank " : "receive from rank ", m.peer, "; ");
        return what + (named > 8 ? "...)" : ")");
      });
  RC_GPU(cudaEventRecord(commAll_, commStream_));
  RC_GPU(cudaStreamWaitEvent(compute_, commAll_, 0));
}

void NcclTransport::flush() {
  std::vector<QueuedSend> all = queue_.takeAll();
  if (!all.empty()) issue(all, nullptr);
}

template <typename Enqueue>
void NcclTransport::runGroup(const std::vector<int>& peers, Enqueue enqueue,
                             const std::function<std::string()>& what) {
  for (int peer : peers)
    if (capturing_ && !connected_[peer]) {
      const std::string why = detail::concat(
          "a CUDA graph capture cannot hold the first exchange with rank ", peer,
          " (NCCL connects to it then): run this collective once before capturing, as a warm-up");
      abort(why);
      RC_THROW(why, where());
    }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (aborted_) throwAborted();
    ncclResult_t rc = api_->ncclGroupStart();
    if (!ncclPosted(rc)) failNcclLocked(rc, what());
    rc = enqueue(comm_);
    const ncclResult_t ended = api_->ncclGroupEnd();  // also after a failed post: ends the group
    if (ncclPosted(rc)) rc = ended;
    if (!ncclPosted(rc)) failNcclLocked(rc, what());
  }
  // The first exchange with a peer connects to it, which waits for the peer.
  awaitNccl(what, options_.timeoutSeconds);
  for (int peer : peers) connected_[peer] = true;
}

void NcclTransport::issue(const std::vector<QueuedSend>& sends, const Receive* receive) {
  // Zero-byte messages are skipped on both sides alike (matching collectives agree on sizes).
  const bool receives = receive != nullptr && receive->bytes > 0;
  bool any = receives;
  for (const QueuedSend& s : sends) any = any || s.bytes > 0;
  if (!any) return;

  for (const QueuedSend& s : sends)
    if (s.bytes > 0) RC_GPU(cudaStreamWaitEvent(commStream_, sendReady(s.id), 0));
  if (receives && receive->slot >= 0 && recvFreePending_[receive->slot]) {
    RC_GPU(cudaStreamWaitEvent(commStream_, recvFree_[receive->slot], 0));
    recvFreePending_[receive->slot] = false;
  } else if (receives && receive->slot < 0) {
    RC_GPU(cudaEventRecord(computeAll_, compute_));
    RC_GPU(cudaStreamWaitEvent(commStream_, computeAll_, 0));
  }

  std::vector<int> peers;
  for (const QueuedSend& s : sends)
    if (s.bytes > 0) peers.push_back(s.peer);
  if (receives) peers.push_back(receive->peer);
  runGroup(
      peers,
      [&](ncclComm_t comm) {
        for (const QueuedSend& s : sends) {
          if (s.bytes == 0) continue;
          const void* data = s.slot >= 0 ? sendSlot(s.slot) : s.src;
          const ncclResult_t rc =
              api_->ncclSend(data, s.bytes, ncclInt8, s.peer, comm, commStream_);
          if (!ncclPosted(rc)) return rc;
        }
        if (!receives) return ncclSuccess;
        return api_->ncclRecv(receive->dst, receive->bytes, ncclInt8, receive->peer, comm,
                              commStream_);
      },
      [&] {
        std::string what = "exchanging a message (";
        for (const QueuedSend& s : sends)
          if (s.bytes > 0) what += detail::concat("send to rank ", s.peer, "; ");
        return what + (receives ? detail::concat("receive from rank ", receive->peer, ")") : ")");
      });

  for (const QueuedSend& s : sends)
    if (s.bytes > 0 && s.slot >= 0) {
      RC_GPU(cudaEventRecord(sendFree_[s.slot], commStream_));
      sendFreePending_[s.slot] = true;
    }
  if (receives) {
    // Compute reads a slot, or may read the caller's bytes this receive wrote.
    cudaEvent_t filled = receive->slot >= 0 ? recvReady_[receive->slot] : commAll_;
    RC_GPU(cudaEventRecord(filled, commStream_));
    RC_GPU(cudaStreamWaitEvent(compute_, filled, 0));
  }
}

// -- publications (see publications.h) -----------------------------------------------------------
//   own area:    compute writes it    -> (all compute so far) -> the exchange group that sends it
//   peer copies: the exchange group   -> commAll              -> every kernel after it
// The group waits for all compute enqueued before it, so it also comes after every kernel that
// still reads the areas it overwrites (an earlier round's copies).

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

void NcclTransport::exchange(const std::vector<PublishOp>& ops, int phase) {
  flush();  // sends queued before it leave first, in the order their receivers expect
  RC_GPU(cudaEventRecord(computeAll_, compute_));
  RC_GPU(cudaStreamWaitEvent(commStream_, computeAll_, 0));
  std::vector<int> peers;
  for (const PublishOp& op : ops) peers.push_back(op.peer);
  runGroup(
      peers,
      [&](ncclComm_t comm) {
        for (const PublishOp& op : ops) {
          const ncclResult_t rc =
              op.send ? api_->ncclSend(staging_ + op.offset, op.bytes, ncclInt8, op.peer, comm,
                                       commStream_)
                      : api_->ncclRecv(staging_ + op.offset, op.bytes, ncclInt8, op.peer, comm,
                                       commStream_);
          if (!ncclPosted(rc)) return rc;
        }
        return ncclSuccess;
      },
      [&] {
        return detail::concat("exchanging publications of phase ", phase, " with every rank (",
                              ops.front().bytes, " bytes each)");
      });
  RC_GPU(cudaEventRecord(commAll_, commStream_));
  RC_GPU(cudaStreamWaitEvent(compute_, commAll_, 0));
}

void NcclTransport::end() {
  publications_.finishRound();
  flush();
  RC_GPU(cudaEventRecord(commAll_, commStream_));
  RC_GPU(cudaStreamWaitEvent(compute_, commAll_, 0));
  if (capturing_) {
    if (!recording_) ++capturedCollectives_;
    // The caller's stream joins the capture's streams back (an event of the capture), then at
    // each replay moves the timeline on (an external record; see begin).
    RC_GPU(cudaEventRecord(done_, compute_));
    RC_GPU(cudaStreamWaitEvent(caller_, done_, 0));
    RC_GPU(cudaEventRecordWithFlags(timeline_, caller_, cudaEventRecordExternal));
    if (recording_) finishRecording();
  } else {
    ++eagerCollectives_;
    RC_GPU(cudaEventRecord(timeline_, compute_));
    RC_GPU(cudaStreamWaitEvent(caller_, timeline_, 0));
    noteInflight(compute_);
  }
  inCollective_ = false;
  if (callerDevice_ != options_.device) RC_GPU(cudaSetDevice(callerDevice_));
}

void NcclTransport::noteInflight(cudaStream_t after) {
  std::lock_guard<std::mutex> lock(mutex_);
  watched_ = true;
  if (inflight_.size() < inflightEvents_.size()) {
    // Entries hold consecutive events of the ring, so the one after the newest is free.
    const int event = static_cast<int>(inflightRecorded_++ % inflightEvents_.size());
    RC_GPU(cudaEventRecord(inflightEvents_[event], after));
    inflight_.push_back(Inflight{event, call_, Clock::now()});
  } else {
    // Many collectives queued: the newest entry now stands for this one too.
    RC_GPU(cudaEventRecord(inflightEvents_[inflight_.back().event], after));
    inflight_.back().call = call_;
  }
}

void NcclTransport::reportCompletionTo(std::shared_ptr<FlightRecorder> recorder) {
  std::lock_guard<std::mutex> lock(mutex_);
  completions_ = std::move(recorder);
}

}  // namespace ringcomm
