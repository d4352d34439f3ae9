// NcclTransport implementation.
//
// Why grouping sends with the next receive cannot deadlock
// --------------------------------------------------------
// NCCL send/recv are rendezvous operations: a send finishes only while the matching receive runs,
// and a group holds its stream until every operation in it has finished. So a lone send group
// on every rank of a ring deadlocks (each waits for a receive queued behind its own send). Here
// commitSend only records a send; the next acquireRecv issues ONE group holding the pending
// send(s) and that receive. The executor runs the same step sequence on every rank of a
// symmetric plan (all_reduce, reduce_scatter, all_gather), so rank r's g-th group holds its
// g-th send to r+1 and its g-th receive from r-1, while rank r+1's g-th group holds the matching
// g-th receive from r: every group's partners sit in the partners' g-th groups, which depend
// only on groups < g. For the chains (broadcast, reduce, gather, scatter) give each message its
// time in a lock-step ring (a message received at time t is forwarded at time t+1): a group
// holds a receive of time t and sends of time <= t, and every operation in a rank's earlier
// groups has a smaller time, so by induction over time every operation's partner is enqueued
// behind finished work only. A rank that only sends (a root) issues its sends in groups of up to
// K when it runs out of slots, and at end(); operations inside one group progress independently,
// so such groups only need their partners to be enqueued, which the same induction gives.
//
// Slot reuse: a send slot is written on `compute` only after `compute` waited for the group that
// last sent from it (sendFree_); a receive slot is overwritten only by a later group, and every
// group first waits for all compute work enqueued so far (computeReady_), reads included.
#include "cuda/nccl_transport.h"

#include <algorithm>
#include <thread>

#include "cuda/cuda_check.h"
#include "ringcomm/error.h"

namespace ringcomm {
namespace {

using Clock = std::chrono::steady_clock;

Clock::time_point deadlineAfter(double seconds) {
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(
                            std::chrono::duration<double>(seconds));
}

// Polling backs off from spinning to short sleeps: ranks may share the host's cores.
void pause(int& rounds) {
  if (++rounds < 64)
    std::this_thread::yield();
  else
    std::this_thread::sleep_for(std::chrono::microseconds(100));
}

}  // namespace

NcclTransport::NcclTransport(const NcclTransportOptions& options) : options_(options) {
  RC_CHECK(options_.worldSize >= 1 && options_.rank >= 0 && options_.rank < options_.worldSize,
           "rank ", options_.rank, " is outside the world of ", options_.worldSize, " ranks");
  RC_CHECK(options_.uniqueId.size() == sizeof(ncclUniqueId), "an NCCL unique id has ",
           sizeof(ncclUniqueId), " bytes, got ", options_.uniqueId.size());
  RC_CHECK(options_.slots >= 2, "NcclTransport needs at least 2 slots per direction");
  RC_CHECK(options_.slotBytes >= 16, "NcclTransport slots must hold at least 16 bytes");
  api_ = &loadNccl(options_.libraryHint);
  try {
    create();
  } catch (...) {
    release();
    throw;
  }
}

void NcclTransport::create() {
  CudaDeviceGuard guard(options_.device);
  RC_CUDA_CHECK(cudaStreamCreateWithFlags(&compute_, cudaStreamNonBlocking));
  RC_CUDA_CHECK(cudaStreamCreateWithFlags(&comm_stream_, cudaStreamNonBlocking));
  for (cudaEvent_t* e : {&callerReady_, &computeReady_, &groupDone_, &commDone_, &done_})
    RC_CUDA_CHECK(cudaEventCreateWithFlags(e, cudaEventDisableTiming));
  sendFree_.assign(options_.slots, nullptr);
  sendSlotGroup_.assign(options_.slots, 0);
  for (cudaEvent_t& e : sendFree_) RC_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  slotStride_ = (options_.slotBytes + 255) / 256 * 256;  // 256-byte aligned: vector kernels
  RC_CUDA_CHECK(cudaMalloc(&buffers_, slotStride_ * 2 * options_.slots));

  ncclUniqueId id;
  std::copy(options_.uniqueId.begin(), options_.uniqueId.end(), id.internal);
  ncclResult_t result;
  if (api_->commInitRankConfig != nullptr) {
    // Non-blocking: init and every enqueue return ncclInProgress instead of blocking, so a
    // missing peer becomes a TimeoutError instead of a hang.
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    result = api_->commInitRankConfig(&comm_, options_.worldSize, id, options_.rank, &config);
  } else {
    result = api_->commInitRank(&comm_, options_.worldSize, id, options_.rank);
  }
  if (result != ncclSuccess && result != ncclInProgress) {
    if (comm_ != nullptr) api_->commAbort(comm_);
    comm_ = nullptr;
    RC_THROW_AS(PeerError, "NCCL communicator creation failed", where(), ": ",
                api_->describe(result));
  }
  waitEnqueued("creating the NCCL communicator");
}

NcclTransport::~NcclTransport() { release(); }

// Frees everything the constructor made; never throws (it runs while exceptions unwind).
void NcclTransport::release() noexcept {
  int previous = -1;
  bool switched = cudaGetDevice(&previous) == cudaSuccess && previous != options_.device &&
                  cudaSetDevice(options_.device) == cudaSuccess;
  if (comm_ != nullptr) {
    bool clean = false;
    ncclResult_t rc = api_->commFinalize ? api_->commFinalize(comm_) : ncclInvalidUsage;
    if (rc == ncclSuccess || rc == ncclInProgress) {
      // Finalize flushes outstanding work; peers that vanished must not hang us forever.
      auto deadline = deadlineAfter(std::min(options_.timeoutSeconds, 30.0));
      ncclResult_t state = ncclInProgress;
      int rounds = 0;
      while (api_->commGetAsyncError(comm_, &state) == ncclSuccess && state == ncclInProgress &&
             Clock::now() < deadline)
        pause(rounds);
      clean = state == ncclSuccess;
    }
    if (clean)
      api_->commDestroy(comm_);
    else
      api_->commAbort(comm_);
    comm_ = nullptr;
  }
  if (compute_) cudaStreamSynchronize(compute_);
  if (comm_stream_) cudaStreamSynchronize(comm_stream_);
  if (buffers_) cudaFree(buffers_);
  buffers_ = nullptr;
  for (cudaEvent_t e : sendFree_)
    if (e) cudaEventDestroy(e);
  sendFree_.clear();
  for (cudaEvent_t* e : {&callerReady_, &computeReady_, &groupDone_, &commDone_, &done_})
    if (*e) cudaEventDestroy(*e), *e = nullptr;
  if (compute_) cudaStreamDestroy(compute_);
  if (comm_stream_) cudaStreamDestroy(comm_stream_);
  compute_ = comm_stream_ = nullptr;
  if (switched) cudaSetDevice(previous);
}

std::string NcclTransport::where() const {
  const int n = options_.worldSize;
  return detail::concat(" on rank ", options_.rank, " of ", n, " (device ", options_.device,
                        "; receives from rank ", (options_.rank + n - 1) % n, ", sends to rank ",
                        (options_.rank + 1) % n, ")");
}

void NcclTransport::checkUsable() const {
  if (aborted_)
    RC_THROW_AS(PeerError, "this NCCL transport was aborted (", failure_,
                "); create a new communicator");
}

void NcclTransport::failNccl(ncclResult_t result, const std::string& what) {
  std::string message = detail::concat("NCCL failed while ", what, where(), ": ",
                                       api_->describe(result, comm_));
  abort(message);
  RC_THROW_AS(PeerError, message);
}

void NcclTransport::checkAsyncError(const std::string& what) {
  ncclResult_t state = ncclSuccess;
  ncclResult_t rc = api_->commGetAsyncError(comm_, &state);
  if (rc != ncclSuccess) failNccl(rc, what);
  if (state != ncclSuccess && state != ncclInProgress) failNccl(state, what);
}

// A non-blocking communicator may still be enqueuing (connecting to a peer the first time);
// no other NCCL call may be made on it until that is done.
void NcclTransport::waitEnqueued(const std::string& what) {
  auto deadline = deadlineAfter(options_.timeoutSeconds);
  int rounds = 0;
  for (;;) {
    ncclResult_t state = ncclSuccess;
    ncclResult_t rc = api_->commGetAsyncError(comm_, &state);
    if (rc != ncclSuccess) failNccl(rc, what);
    if (state == ncclSuccess) return;
    if (state != ncclInProgress) failNccl(state, what);
    if (Clock::now() >= deadline) {
      std::string message = detail::concat("timed out after ", options_.timeoutSeconds,
                                           " s while ", what, where(),
                                           ": is the peer alive and running the same collective?");
      abort(message);
      RC_THROW_AS(TimeoutError, message);
    }
    pause(rounds);
  }
}

void NcclTransport::begin(cudaStream_t caller) {
  checkUsable();
  checkAsyncError("checking the previous collective");
  // Watchdog without a thread: a collective that did not finish within the timeout is stuck.
  if (lastIssued_ && !capturing_ && Clock::now() - lastIssueTime_ >
                                         std::chrono::duration<double>(options_.timeoutSeconds) &&
      !query()) {
    std::string message = detail::concat("the previous collective did not finish within ",
                                         options_.timeoutSeconds, " s", where());
    abort(message);
    RC_THROW_AS(TimeoutError, message);
  }
  caller_ = caller;
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  RC_CUDA_CHECK(cudaStreamIsCapturing(caller, &status));
  capturing_ = status == cudaStreamCaptureStatusActive;
  RC_CUDA_CHECK(cudaEventRecord(callerReady_, caller));
  RC_CUDA_CHECK(cudaStreamWaitEvent(compute_, callerReady_, 0));
  RC_CUDA_CHECK(cudaStreamWaitEvent(comm_stream_, callerReady_, 0));
  pending_.clear();
  acquiredSend_ = -1;
  heldRecvs_ = 0;
}

void* NcclTransport::acquireSend(int peer, size_t bytes) {
  checkUsable();
  RC_CHECK(peer >= 0 && peer < options_.worldSize, "send to rank ", peer, " outside the world");
  RC_CHECK(bytes <= options_.slotBytes, "a ", bytes, "-byte message exceeds the ",
           options_.slotBytes, "-byte NCCL staging slot");
  const int slot = static_cast<int>(nextSend_++ % options_.slots);
  for (const PendingSend& p : pending_)
    if (p.slot == slot) {
      flush();  // every slot holds an unsent message: send them before reusing one
      break;
    }
  if (sendSlotGroup_[slot] > computeWaitedGroup_)
    RC_CUDA_CHECK(cudaStreamWaitEvent(compute_, sendFree_[slot], 0));
  acquiredSend_ = slot;
  return sendSlot(slot);
}

void NcclTransport::commitSend(int peer, const Envelope& envelope) {
  checkUsable();
  RC_CHECK(acquiredSend_ >= 0, "commitSend without acquireSend");
  pending_.push_back(PendingSend{peer, acquiredSend_, static_cast<size_t>(envelope.bytes)});
  acquiredSend_ = -1;
}

const void* NcclTransport::acquireRecv(int peer, const Envelope& expected) {
  checkUsable();
  RC_CHECK(peer >= 0 && peer < options_.worldSize, "receive from rank ", peer,
           " outside the world");
  RC_CHECK(expected.bytes <= options_.slotBytes, "a ", expected.bytes,
           "-byte message exceeds the ", options_.slotBytes, "-byte NCCL staging slot");
  // Ring plans never hold more than one receive; more would need more slots than reuse allows.
  RC_CHECK(heldRecvs_ < options_.slots - 1, "too many receive slots held at once");
  char* slot = recvSlot(static_cast<int>(nextRecv_++ % options_.slots));
  issueGroup(peer, slot, static_cast<size_t>(expected.bytes));
  ++heldRecvs_;
  return slot;
}

void NcclTransport::releaseRecv(int /*peer*/) {
  RC_CHECK(heldRecvs_ > 0, "releaseRecv without acquireRecv");
  --heldRecvs_;  // the next group waits for every compute read before overwriting the slot
}

void NcclTransport::flush() {
  checkUsable();
  if (!pending_.empty()) issueGroup(-1, nullptr, 0);
}

void NcclTransport::issueGroup(int recvPeer, void* recvBuffer, size_t recvBytes) {
  // Zero-byte messages are skipped on both sides alike (matching collectives agree on sizes).
  bool any = recvPeer >= 0 && recvBytes > 0;
  for (const PendingSend& p : pending_) any = any || p.bytes > 0;
  if (!any) {
    pending_.clear();
    return;
  }
  std::string what = "exchanging a message (";
  for (const PendingSend& p : pending_) what += detail::concat("send to rank ", p.peer, "; ");
  what += recvPeer >= 0 ? detail::concat("receive from rank ", recvPeer, ")") : ")";

  // Sends read what compute wrote; the receive overwrites a slot compute may still read.
  RC_CUDA_CHECK(cudaEventRecord(computeReady_, compute_));
  RC_CUDA_CHECK(cudaStreamWaitEvent(comm_stream_, computeReady_, 0));
  ncclResult_t rc = api_->groupStart();
  if (rc != ncclSuccess) failNccl(rc, what);
  for (const PendingSend& p : pending_) {
    if (p.bytes == 0) continue;
    rc = api_->send(sendSlot(p.slot), p.bytes, ncclInt8, p.peer, comm_, comm_stream_);
    if (rc != ncclSuccess && rc != ncclInProgress) {
      api_->groupEnd();
      failNccl(rc, what);
    }
  }
  if (recvPeer >= 0 && recvBytes > 0) {
    rc = api_->recv(recvBuffer, recvBytes, ncclInt8, recvPeer, comm_, comm_stream_);
    if (rc != ncclSuccess && rc != ncclInProgress) {
      api_->groupEnd();
      failNccl(rc, what);
    }
  }
  rc = api_->groupEnd();
  if (rc != ncclSuccess && rc != ncclInProgress) failNccl(rc, what);
  if (rc == ncclInProgress) waitEnqueued(what);

  ++groupCount_;
  for (const PendingSend& p : pending_) {
    RC_CUDA_CHECK(cudaEventRecord(sendFree_[p.slot], comm_stream_));
    sendSlotGroup_[p.slot] = groupCount_;
  }
  pending_.clear();
  if (recvPeer >= 0) {
    // The reducer reads the received slice on compute.
    RC_CUDA_CHECK(cudaEventRecord(groupDone_, comm_stream_));
    RC_CUDA_CHECK(cudaStreamWaitEvent(compute_, groupDone_, 0));
    computeWaitedGroup_ = groupCount_;
  }
}

void NcclTransport::end() {
  flush();
  RC_CUDA_CHECK(cudaEventRecord(commDone_, comm_stream_));
  RC_CUDA_CHECK(cudaStreamWaitEvent(compute_, commDone_, 0));
  RC_CUDA_CHECK(cudaEventRecord(done_, compute_));
  RC_CUDA_CHECK(cudaStreamWaitEvent(caller_, done_, 0));
  computeWaitedGroup_ = groupCount_;
  // Outside graph capture, also order the next collective's receives after this one's reads,
  // whatever stream the next caller uses. Inside a capture that wait would leave the comm
  // stream unjoined; graph replays are ordered by the caller's stream instead.
  if (!capturing_) RC_CUDA_CHECK(cudaStreamWaitEvent(comm_stream_, done_, 0));
  lastIssued_ = true;
  lastIssueTime_ = Clock::now();
}

bool NcclTransport::query() {
  checkUsable();
  checkAsyncError("running a collective");
  if (!lastIssued_ || capturing_) return true;
  cudaError_t status = cudaEventQuery(done_);
  if (status == cudaErrorNotReady) return false;
  RC_CUDA_CHECK(status);
  return true;
}

void NcclTransport::synchronize(double timeoutSeconds) {
  auto deadline = deadlineAfter(timeoutSeconds > 0 ? timeoutSeconds : options_.timeoutSeconds);
  int rounds = 0;
  while (!query()) {
    if (Clock::now() >= deadline) {
      std::string message = detail::concat("a collective did not finish within ",
                                           timeoutSeconds, " s", where(),
                                           ": is every rank calling the same collectives?");
      abort(message);
      RC_THROW_AS(TimeoutError, message);
    }
    pause(rounds);
  }
}

void NcclTransport::abort(const std::string& why) {
  if (aborted_) return;
  aborted_ = true;
  failure_ = why;
  if (comm_ != nullptr) {
    // ncclCommAbort also stops this rank's kernels still waiting on a peer.
    api_->commAbort(comm_);
    comm_ = nullptr;
  }
}

}  // namespace ringcomm
