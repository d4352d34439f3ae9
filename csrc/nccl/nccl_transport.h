// NcclTransport: the ring's messages over NCCL point-to-point, with ringcomm's own
// non-blocking ncclComm_t.
//
// Failure handling. Every NCCL call returns at once (a non-blocking communicator): a call that
// must wait for peers (creation, the first exchange with a peer, which connects to it, a full
// queue, finalize) returns ncclInProgress, and the owning thread polls ncclCommGetAsyncError
// until it is done, failed or past the timeout; past it, the owner aborts. A watchdog thread
// aborts a collective still running on the GPU past the timeout while the owner waits
// elsewhere. Every call on the communicator, the watchdog's abort included, holds one mutex,
// so the communicator is only ever called by one thread at a time and never after its abort
// freed it. Every CUDA and NCCL call goes through a GpuApi table (gpu_api.h).
//
// Work runs on two streams the transport owns: `compute` (the reducer's kernels, which fill
// send slots and read receive slots) and `comm` (NCCL groups). Events order them per slot, so
// a group waits only for the kernel that filled its send slot and a kernel only for the group
// that filled its receive slot: the reduce of one slice overlaps the transfer of the next (see
// group_queue.h for which operations share a group). Copy-only steps send from and receive
// into the caller's buffers, with no staging copy. A collective is bracketed by begin(stream)
// and end(): both streams start after the work on the caller's stream, and the caller's
// stream waits for the collective; the host never waits (capturable in a CUDA graph).
// Publications (one-hop algorithms) are exchanged with every peer in one group at their first
// read (publications.h): device memory of (2 x world size + 2) x publishBytes per rank.
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "nccl/gpu_api.h"
#include "nccl/graph_holds.h"
#include "nccl/group_queue.h"
#include "nccl/publications.h"
#include "nccl/transport_options.h"
#include "ringcomm/flight_recorder.h"
#include "ringcomm/transport.h"

namespace ringcomm {

// A call on a non-blocking communicator may return ncclInProgress (NCCL returns the
// communicator's state from each call): the operation was taken and completes later, so a group
// keeps posting; only other results are failures.
inline bool ncclPosted(ncclResult_t rc) { return rc == ncclSuccess || rc == ncclInProgress; }

class NcclTransport : public Transport {
 public:
  explicit NcclTransport(const CudaTransportOptions& options);
  ~NcclTransport() override;
  NcclTransport(const NcclTransport&) = delete;
  NcclTransport& operator=(const NcclTransport&) = delete;

  size_t maxMessageBytes() const override { return options_.slotBytes; }
  size_t columnsPerWave() const override { return GroupQueue::columnsPerWave(options_.slots); }
  void* acquireSend(int peer, size_t bytes) override;
  void commitSend(int peer, const Envelope& envelope) override;
  const void* acquireRecv(int peer, const Envelope& expected) override;
  void releaseRecv(int peer) override;
  bool movesUserBuffers() const override { return true; }
  void sendFrom(int peer, const void* src, const Envelope& envelope) override;
  void recvInto(int peer, void* dst, const Envelope& expected) override;
  void sendRecvBatch(const std::vector<DirectMessage>& messages) override;
  void abort(const std::string& why) override;
  size_t publishBytes() const override { return options_.publishBytes; }
  void* acquirePublish(int phase, size_t bytes) override;
  void commitPublish(int phase, const Envelope& envelope) override;
  const void* acquirePublished(int peer, int phase, const Envelope& expected) override;
  // Without a declaration every peer's size is taken to be this rank's.
  void expectPublished(int phase, const std::vector<size_t>& bytesPerRank) override {
    publications_.expect(phase, bytesPerRank);
  }
  void begin(uintptr_t stream, const CallName& call) override;
  void end() override;
  bool replay(uintptr_t stream, const CallName& call) override;
  // The last call's work is watched on the GPU (not captured into the caller's graph).
  bool completesOnDevice() const override { return watched_; }
  void reportCompletionTo(std::shared_ptr<FlightRecorder> recorder) override;

  // Whether every collective enqueued outside graph capture has finished; raises on an NCCL
  // error or after the watchdog aborted. Captured collectives finish when their graph replays,
  // which the caller orders on its own streams.
  bool query();
  // Host wait for query() with a deadline (the communicator's timeout when <= 0); aborts and
  // raises TimeoutError past it.
  void synchronize(double timeoutSeconds);

  cudaStream_t computeStream() const { return compute_; }
  int device() const { return options_.device; }

 private:
  struct Receive {
    int peer;
    void* dst;
    size_t bytes;
    int slot;  // -1: straight into the caller's buffer
  };

  void create();
  void release() noexcept;
  // What release() frees, taken out of the transport (nccl_release.cc): freed at once, or
  // by the last graph of the caller's that holds it (graph_holds.h).
  struct Leftovers;
  std::shared_ptr<Leftovers> takeLeftovers();
  // Ties the resources to the graph the caller's stream is capturing (a user object).
  void holdForCallersGraph();
  void checkUsable() const {
    if (aborted_.load(std::memory_order_acquire)) throwAborted();
  }
  [[noreturn]] void throwAborted() const;
  void issue(const std::vector<QueuedSend>& sends, const Receive* receive);
  void exchange(const std::vector<PublishOp>& ops, int phase);
  // One NCCL group: `enqueue(comm)` posts its operations between ncclGroupStart and
  // ncclGroupEnd (returning the first failure); then the owner waits until NCCL has enqueued
  // them (the first exchange with a peer connects to it). `what()` names the group, for errors.
  // `peers`: the ranks it sends to and receives from; inside a capture each such direction must
  // have been connected before (NCCL connects a peer's send and receive sides separately).
  struct Link {
    int peer;
    bool send;
  };
  bool connected(const Link& link) const {
    return (link.send ? sendConnected_ : recvConnected_)[link.peer];
  }
  template <typename Enqueue>
  void runGroup(const std::vector<Link>& peers, Enqueue enqueue,
                const std::function<std::string()>& what);
  // Polls ncclCommGetAsyncError until the last call is done; aborts and raises past the limit.
  // `what()` is only called to describe a failure.
  void awaitNccl(const std::function<std::string()>& what, double limitSeconds);
  void checkInterrupt(int rounds, const std::function<std::string()>& what);
  void flush();
  bool shouldRecord(const ReplayKey& key);
  void finishRecording();
  void endRecording() noexcept;
  void dropRecordings() noexcept;
  void noteInflight(cudaStream_t after);  // the watchdog watches what `after` holds now
  void queueSend(const QueuedSend& send);
  void watch();
  bool pollInflightLocked();
  void abortLocked(const std::string& why);
  [[noreturn]] void failNcclLocked(ncclResult_t result, const std::string& what);
  void check(cudaError_t status, const char* call) const {
    if (status != cudaSuccess) failCuda(status, call);
  }
  [[noreturn]] void failCuda(cudaError_t status, const char* call) const;
  std::string where() const;
  char* sendSlot(int i) const { return buffers_ + static_cast<size_t>(i) * slotStride_; }
  char* recvSlot(int i) const {
    return buffers_ + static_cast<size_t>(options_.slots + i) * slotStride_;
  }
  cudaEvent_t sendReady(uint64_t id) const { return sendReady_[id % sendReady_.size()]; }

  CudaTransportOptions options_;
  const GpuApi* api_ = nullptr;
  ncclComm_t comm_ = nullptr;

  cudaStream_t compute_ = nullptr, commStream_ = nullptr, caller_ = nullptr;
  int callerDevice_ = -1;
  CallName call_;  // the call between begin() and end()
  bool inCollective_ = false;  // between begin() and end()
  bool capturing_ = false;
  cudaEvent_t callerReady_ = nullptr, computeAll_ = nullptr, commAll_ = nullptr, done_ = nullptr;
  cudaEvent_t timeline_ = nullptr;  // the end of the latest collective launched, eager or replayed
  // (done_: the end of a captured one, inside its graph)
  std::vector<cudaEvent_t> sendReady_;  // per queued send (ring of 2 x slots): its data is written
  std::vector<cudaEvent_t> sendFree_;   // per send slot: the group that sent it finished
  std::vector<cudaEvent_t> recvReady_;  // per receive slot: the group that filled it finished
  std::vector<cudaEvent_t> recvFree_;   // per receive slot: the kernel that read it finished
  std::vector<bool> sendFreePending_, recvFreePending_;

  char* buffers_ = nullptr;
  size_t slotStride_ = 0;
  GroupQueue queue_;
  Publications publications_;
  char* staging_ = nullptr;  // publications_.stagingBytes()
  int stagedSlot_ = -1;
  uint64_t sendCount_ = 0, recvCount_ = 0;
  // Per peer and direction: an exchange has completed (NCCL connected that side).
  std::vector<bool> sendConnected_, recvConnected_;
  uint64_t eagerCollectives_ = 0;
  std::shared_ptr<GraphHolds> holds_ = std::make_shared<GraphHolds>();  // the caller's graphs
  bool released_ = false;

  // Graphs of repeated collectives (recordGraphs): a key seen once is recorded when it comes
  // again, on recordStream_, then launched on the caller's stream.
  struct Recording {
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
  };
  static constexpr size_t kMaxRecordings = 64, kMaxSeen = 256;
  std::map<ReplayKey, Recording> recordings_;
  std::set<ReplayKey> seenOnce_;
  cudaStream_t recordStream_ = nullptr, recordingFor_ = nullptr;
  bool recording_ = false;
  ReplayKey recordingKey_;
  int heldRecvSlot_ = -1;

  // Eager collectives still running: the watchdog gives each the whole timeout from the moment
  // the one before it finished.
  struct Inflight {
    int event;  // in inflightEvents_, recorded on compute at end()
    CallName call;
    std::chrono::steady_clock::time_point since;
  };
  static constexpr size_t kInflightEvents = 64;
  std::vector<cudaEvent_t> inflightEvents_;
  std::deque<Inflight> inflight_;
  uint64_t inflightRecorded_ = 0;
  bool watched_ = false;  // the last call was noted in inflight_
  std::shared_ptr<FlightRecorder> completions_;  // told of each collective seen done

  // Shared with the watchdog thread. `mutex_` is held around every NCCL call (see the top).
  std::mutex mutex_;
  std::condition_variable wake_;
  std::thread watchdog_;
  bool stopping_ = false;
  std::atomic<bool> aborted_{false};  // written under mutex_; read without it on the data path
  bool timedOut_ = false;
  std::string failure_;
};

}  // namespace ringcomm
